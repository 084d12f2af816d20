#include "slope/kernels/attention.h"
#include "slope/kernels/bf16_units.h"
extern "C" __attribute__((visibility("default"))) void old_flash(const slope::kernels::AttentionArgs* a) {
  slope::kernels::flash_attention(*a);
}
extern "C" __attribute__((visibility("default"))) void old_init() {
  slope::kernels::set_bf16_units(slope::kernels::Bf16Units::Bf16);
}
