// Linked with LibTorch (CPU and CUDA libraries) like the workers: std::filesystem must be
// libstdc++'s, not the stale copy libtorch_cuda.so exports (see cmake/DflashHelpers.cmake).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace {

TEST(TorchLinkedBinary, StdFilesystemRemoveAllWorks) {
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/dflash-fs-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path root(tmpl);
  fs::create_directories(root / "a" / "b");
  std::ofstream(root / "a" / "b" / "f") << "x";
  std::ofstream(root / "g") << "y";
  EXPECT_EQ(fs::remove_all(root), 5u);  // root, a, a/b, a/b/f, g
  EXPECT_FALSE(fs::exists(root));
}

}  // namespace
