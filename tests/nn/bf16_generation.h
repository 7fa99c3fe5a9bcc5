// Generation in bf16 against the fp32 greedy generation of transformers (the oracles'
// `*_generate.safetensors`: tokens, fp32 logit margins, transformers' own bf16 argmax), on the CPU
// (generate_test.cc) and on a GPU (generate_gpu_test.cc). docs/models.md, "Generation in bf16",
// says why bf16 cannot be compared token for token on the tiny random checkpoints.
#pragma once

#include <c10/core/Device.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace dflash::nn::oracle {

// Every family whose greedy generation the oracles write, with the folder that holds it.
std::vector<std::pair<std::string, std::filesystem::path>> AllFamilies();

// An fp32 logit gap at or above which the bf16 model must pick the fp32 token (transformers' own
// bf16 departed at gaps up to about 0.45 on these checkpoints).
inline constexpr double kTieMargin = 1.0;

// Loads `family` in bf16 on `device` and checks, over each prompt of its oracle file:
// teacher-forced on prompt + the fp32 tokens, the bf16 argmax equals the fp32 token at every step
// whose margin is at least kTieMargin, and departs at no more steps than transformers' bf16 does
// plus 2 per prompt; free-running bf16 generation equals the fp32 tokens up to the first step
// below kTieMargin. Prints both departure counts. Failures are GoogleTest failures.
void CheckBf16AgainstFp32(const std::string& family, const std::filesystem::path& dir,
                          c10::Device device);

}  // namespace dflash::nn::oracle
