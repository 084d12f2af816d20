// MXFP4 (OCP microscaling FP4) dequantisation, exactly as HF transformers' integrations/mxfp4.py:
// blocks of 32 e2m1 values along the input dimension, 16 bytes each (element 2j in the low
// nibble of byte j, 2j+1 in the high nibble) and one e8m0 scale byte:
//   value = FP4[nibble] · 2^(scale − 127),  FP4 = {±0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 = sign.
#pragma once

#include <cstdint>

namespace slope::kernels {

// blocks: [rows, nblocks, 16] u8; scales: [rows, nblocks] u8; out: [rows, nblocks·32] f32.
void mxfp4_dequantize(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t nblocks,
                      float* out);

}  // namespace slope::kernels
