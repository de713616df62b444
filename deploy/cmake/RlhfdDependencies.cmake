# Finds every third-party dependency once, so component CMakeLists only name targets.
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(Catch2 2 REQUIRED)
# libsystemd's sd_notify: readiness and the watchdog of the daemons' Type=notify units.
find_package(PkgConfig REQUIRED)
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET GLOBAL libsystemd)

find_program(RLHFD_PROTOC protoc REQUIRED)
find_program(RLHFD_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

# CUDA runtime (static, so CPU-only hosts run the same binaries) and NCCL, when present.
set(RLHFD_HAVE_CUDA OFF)
if(RLHFD_WITH_CUDA)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_path(RLHFD_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(RLHFD_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR}
                 "${CUDAToolkit_LIBRARY_ROOT}/lib")
    if(RLHFD_NCCL_INCLUDE_DIR AND RLHFD_NCCL_LIBRARY)
      set(RLHFD_HAVE_CUDA ON)
      add_library(rlhfd_nccl INTERFACE)
      target_include_directories(rlhfd_nccl INTERFACE ${RLHFD_NCCL_INCLUDE_DIR})
      target_link_libraries(rlhfd_nccl INTERFACE ${RLHFD_NCCL_LIBRARY} CUDA::cudart)
      # Our own kernels (worker/rollout): Hopper, the GPUs we ship for, unless told otherwise.
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES 90)
      endif()
      set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
      enable_language(CUDA)
      set(CMAKE_CUDA_STANDARD 17)
      set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    endif()
  endif()
endif()
message(STATUS "rlhfd: CUDA + NCCL ${RLHFD_HAVE_CUDA}")

# LibTorch from the project's virtualenv (torch==2.11.0 wheel); only worker/ and GPU tests use it.
set(RLHFD_HAVE_TORCH OFF)
if(RLHFD_WITH_TORCH)
  if(NOT EXISTS "${RLHFD_PYTHON}")
    message(FATAL_ERROR "rlhfd: ${RLHFD_PYTHON} not found. Run deploy/setup.sh, or configure with "
                        "-DRLHFD_PYTHON=<python with torch> or -DRLHFD_WITH_TORCH=OFF.")
  endif()
  execute_process(
    COMMAND "${RLHFD_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE RLHFD_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE torch_rc)
  if(NOT torch_rc EQUAL 0)
    message(FATAL_ERROR "rlhfd: ${RLHFD_PYTHON} cannot import torch. Run deploy/setup.sh.")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${RLHFD_TORCH_PREFIX}")
  if(NOT RLHFD_HAVE_CUDA)
    # A CUDA wheel's config looks for the toolkit; without one use its CPU libraries only.
    set(USE_CUDA OFF)
  endif()
  # Naming the architecture stops the wheel's config from compiling a GPU probe; Hopper (H100,
  # H200) is what we ship for. Our own CUDA code sets its architectures separately.
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
  endif()
  find_package(Torch REQUIRED)
  # The wheel's include dir carries an old copy of protobuf's headers (google/protobuf, for
  # caffe2), which would shadow Debian's protobuf 3.21 in any file that includes both LibTorch and
  # our generated protos. LibTorch targets get a mirror of that dir without google/ instead.
  get_filename_component(torch_include "${TORCH_INSTALL_PREFIX}/include" ABSOLUTE)
  set(torch_mirror "${CMAKE_BINARY_DIR}/torch_include")
  file(GLOB torch_entries RELATIVE "${torch_include}" "${torch_include}/*")
  foreach(entry ${torch_entries})
    if(NOT entry STREQUAL "google" AND NOT EXISTS "${torch_mirror}/${entry}")
      file(MAKE_DIRECTORY "${torch_mirror}")
      file(CREATE_LINK "${torch_include}/${entry}" "${torch_mirror}/${entry}" SYMBOLIC)
    endif()
  endforeach()
  foreach(target torch torch_library torch_cpu torch_cpu_library torch_cuda torch_cuda_library
                 c10 c10_cuda)
    if(TARGET ${target})
      get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
      if(dirs)
        list(TRANSFORM dirs REPLACE "^${torch_include}$" "${torch_mirror}")
        set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${dirs}")
      endif()
    endif()
  endforeach()
  set(RLHFD_HAVE_TORCH ON)
  get_filename_component(RLHFD_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
endif()
message(STATUS "rlhfd: LibTorch ${RLHFD_HAVE_TORCH}")

# Apache Arrow's C++ Parquet reader, from the project's virtualenv (the pyarrow wheel ships
# libarrow and libparquet with their headers, built with the new C++ ABI; Debian 12 has no
# libarrow-dev). Only the controller's Parquet reader plugin links it (parquet_reader.cc).
set(RLHFD_HAVE_PARQUET OFF)
if(RLHFD_WITH_PARQUET)
  execute_process(
    COMMAND "${RLHFD_PYTHON}" -c
            "import pyarrow; print(pyarrow.get_include()); print(pyarrow.get_library_dirs()[0])"
    OUTPUT_VARIABLE arrow_paths OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE arrow_rc)
  if(NOT arrow_rc EQUAL 0)
    message(FATAL_ERROR "rlhfd: ${RLHFD_PYTHON} cannot import pyarrow. Run deploy/setup.sh, or "
                        "configure with -DRLHFD_WITH_PARQUET=OFF (no .parquet data).")
  endif()
  string(REPLACE "\n" ";" arrow_paths "${arrow_paths}")
  list(GET arrow_paths 0 RLHFD_ARROW_INCLUDE_DIR)
  list(GET arrow_paths 1 RLHFD_ARROW_LIB_DIR)
  # The wheel has only the versioned names (libarrow.so.2600), which find_library does not take.
  file(GLOB RLHFD_ARROW_LIBRARY "${RLHFD_ARROW_LIB_DIR}/libarrow.so.[0-9]*")
  file(GLOB RLHFD_PARQUET_LIBRARY "${RLHFD_ARROW_LIB_DIR}/libparquet.so.[0-9]*")
  if(NOT RLHFD_ARROW_LIBRARY OR NOT RLHFD_PARQUET_LIBRARY)
    message(FATAL_ERROR "rlhfd: no libarrow.so.N / libparquet.so.N in ${RLHFD_ARROW_LIB_DIR}")
  endif()
  add_library(rlhfd_arrow INTERFACE)
  # SYSTEM: Arrow's headers are not ours to keep free of warnings.
  target_include_directories(rlhfd_arrow SYSTEM INTERFACE "${RLHFD_ARROW_INCLUDE_DIR}")
  target_link_libraries(rlhfd_arrow INTERFACE ${RLHFD_PARQUET_LIBRARY} ${RLHFD_ARROW_LIBRARY})
  set(RLHFD_HAVE_PARQUET ON)
endif()
message(STATUS "rlhfd: Parquet (Arrow C++ from pyarrow) ${RLHFD_HAVE_PARQUET}")
