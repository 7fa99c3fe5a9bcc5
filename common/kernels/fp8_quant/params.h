// Rowwise e4m3 quantization in one kernel (common/kernels/fp8_quant/fp8_quant.h): the plain struct
// shared by the launcher (fp8_quant_launch.cu) and the LibTorch binding (fp8_quant.cc).
#pragma once

#include <cstdint>

namespace dflash::kernels {

enum class Fp8QuantDType : int { kFloat32 = 0, kBFloat16 = 1 };

// x [rows, cols] contiguous in `dtype`. Rows mode (columns = false): each row r of x gets the scale
//   s_r = T(max(max_c |x_rc|, or 1 for a row of zeros) / 448)   (T: rounded to x's dtype)
// and q[r][c] = e4m3(clamp(T(x_rc / s_r), -448, 448)) (round to nearest even), q [rows, cols],
// scale [rows] fp32. Columns mode: the same for each column of x (over its rows), written
// transposed, q [cols, padded_rows] with zeros past `rows` (padded_rows >= rows), scale [cols].
// What drafter::QuantizeRowsE4m3 / QuantizeColumnsE4m3 compute with LibTorch's operators, the CPU
// reference.
struct Fp8QuantParams {
  const void* x = nullptr;
  void* q = nullptr;         // Float8_e4m3fn bytes
  float* scale = nullptr;    // fp32
  uint32_t* amax = nullptr;  // columns mode: [cols] scratch, zeroed by the caller
  int64_t rows = 0, cols = 0, padded_rows = 0;
  Fp8QuantDType dtype = Fp8QuantDType::kBFloat16;
  bool columns = false;
};

// Queues the kernels on `stream` (a cudaStream_t); returns a cudaError_t.
int LaunchFp8Quant(const Fp8QuantParams& p, void* stream);

}  // namespace dflash::kernels
