// examples/train_gpt_bf16.cpp — train_gpt's --dtype bf16 half: the same program (train_gpt.cpp,
// included here) with the model in bfloat16, in a translation unit of its own so that it builds
// in parallel with the fp32 one. main() (train_gpt.cpp) calls train_gpt_bf16() for --dtype bf16.
#define DTENSOR_TRAIN_GPT_BF16_PART 1
#include "train_gpt.cpp"
