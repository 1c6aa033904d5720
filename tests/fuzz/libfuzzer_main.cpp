// One libFuzzer binary per target: DDPRUN_FUZZ_ENTRY names the entry (fuzz_entries.h).
#include "fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ddprun::fuzz::DDPRUN_FUZZ_ENTRY(data, size);
  return 0;
}
