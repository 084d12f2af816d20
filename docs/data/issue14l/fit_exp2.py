import numpy as np
def fit(deg, iters=30):
    # minimax-ish via iteratively reweighted least squares on relative error, on [0,1]
    x = np.linspace(0,1,20001)
    y = np.exp2(x)
    w = np.ones_like(x)
    for it in range(60):
        A = np.vander(x, deg+1) / y[:,None]
        c, *_ = np.linalg.lstsq(A*w[:,None], np.ones_like(x)*w, rcond=None)
        e = np.abs(np.polyval(c, x)/y - 1)
        w = w * (1 + 50*e/e.max())
        w /= w.mean()
    return c
for deg in (3,4,5):
    c = fit(deg)
    c = c.astype(np.float32)
    # force constant term 1 exactly? evaluate float32 horner
    xs = np.arange(0, 2**24, dtype=np.float64)/2**24
    xs = xs.astype(np.float32)
    p = np.full_like(xs, c[0])
    for ci in c[1:]:
        p = (p*xs + ci).astype(np.float32)  # not fma exact but close
    rel = np.abs(p.astype(np.float64)/np.exp2(xs.astype(np.float64)) - 1)
    print(deg, [float(v) for v in c], rel.max(), "p(1)/2:", float(p[-1]), "at f=0:", float(p[0]))
