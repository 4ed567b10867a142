// examples/generate.cpp — text from a train_gpt checkpoint (the main job's: build-main/train_gpt_ckpt).
//
//   generate --resume build-main/train_gpt_ckpt --prompt "The " --generate 200 [--temperature 0.8 --top-k 20]
//   generate --resume DIR --pp 1 --fsdp 1 --cp 1 --tp 2 --ep 1      # any mesh: the checkpoint reshards
//
// The trainer's own code (train_gpt.hpp), run with no training steps: parse_generate reads the
// model's shape from the checkpoint, the model is built and loaded on the mesh the flags give,
// and models::generate runs over its pipeline stages with a KV cache per stage (generate_text).
// In float: the checkpoint's master weights are fp32 whatever --dtype trained them.
#include "train_gpt.hpp"

int main(int argc, char** argv) {
  using namespace examples::gpt;
  auto f32 = [](int c, char** v, const Options& o) { return run<float>(c, v, o); };
  return examples::gpt::main(argc, argv, /*cuda_build=*/false, f32, f32, /*generate_program=*/true);
}
