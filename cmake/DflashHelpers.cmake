# Small helpers shared by every CMakeLists in the tree.

# dflash_library(NAME SRCS... DEPS... [PRIVATE_DEPS...]) builds a static library rooted at the source tree so that
# includes read "common/base/status.h".
function(dflash_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SRCS})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/proto_gen)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  if(ARG_PRIVATE_DEPS)
    target_link_libraries(${name} PRIVATE ${ARG_PRIVATE_DEPS})
  endif()
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
endfunction()

# libtorch_cuda.so exports its own old copy of std::filesystem; whichever library comes first in
# an executable's DT_NEEDED list wins symbol resolution, and with LibTorch first
# std::filesystem::remove_all segfaults (seen on the torch 2.11.0 cu130 wheel). Every executable
# therefore names libstdc++ first. tests/unit/torch_link_test.cc keeps this honest.
function(dflash_libstdcxx_first name)
  target_link_options(${name} PRIVATE "LINKER:--push-state,--no-as-needed" "-lstdc++"
                      "LINKER:--pop-state")
endfunction()

function(dflash_executable name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  dflash_libstdcxx_first(${name})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()

# LibTorch ships its own (older) google/protobuf headers in its include directory. A translation
# unit that sees both LibTorch's include path and our generated .pb.h files fails to compile, so
# LibTorch is always a PRIVATE dependency of the library that uses it, and such libraries expose
# plain C++ headers only.
