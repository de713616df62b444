# rlhfd_library / rlhfd_test: the two helpers every component CMakeLists uses (in the spirit of
# Abseil's absl_cc_library), so per-folder files stay a few lines long.

# rlhfd_library(NAME name SRCS ... [DEPS ...] [TORCH])
# A static library; TORCH marks targets that include LibTorch and gives them its precompiled
# header, so only those targets pay for it.
function(rlhfd_library)
  cmake_parse_arguments(ARG "TORCH" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(${ARG_NAME} STATIC ${ARG_SRCS})
  target_include_directories(${ARG_NAME} PUBLIC ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
  target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS})
  if(ARG_TORCH)
    rlhfd_use_torch(${ARG_NAME})
  endif()
endfunction()

# rlhfd_cuda_kernels(NAME name FOR target SRCS file.cu ...)
# CUDA kernels built with nvcc alone (no LibTorch headers) into their own static library, linked
# into `target`, which gets RLHFD_HAVE_CUDA=1 to call them. Only where RLHFD_HAVE_CUDA is on.
function(rlhfd_cuda_kernels)
  cmake_parse_arguments(ARG "" "NAME;FOR" "SRCS" ${ARGN})
  add_library(${ARG_NAME} STATIC ${ARG_SRCS})
  target_include_directories(${ARG_NAME} PUBLIC ${CMAKE_SOURCE_DIR})
  target_compile_definitions(${ARG_NAME} PRIVATE RLHFD_HAVE_CUDA=1)
  set_target_properties(${ARG_NAME} PROPERTIES
    CUDA_RUNTIME_LIBRARY Shared POSITION_INDEPENDENT_CODE ON)
  target_link_libraries(${ARG_NAME} PUBLIC CUDA::cudart)
  target_link_libraries(${ARG_FOR} PUBLIC ${ARG_NAME})
  target_compile_definitions(${ARG_FOR} PRIVATE RLHFD_HAVE_CUDA=1)
endfunction()

# Links LibTorch with a shared precompiled header of the narrow ATen headers.
function(rlhfd_use_torch target)
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES} Threads::Threads)
  target_precompile_headers(${target} REUSE_FROM rlhfd_torch_pch)
endfunction()

# rlhfd_test(NAME name SRCS ... [DEPS ...] [GPU] [TORCH] [DAEMONS] [PARTS] [LABELS ...])
# A Catch2 v2 test binary registered with CTest as one test (PARTS: not registered; the caller
# registers its parts). Binaries are never run at build time.
# GPU binaries use tests/support/gpu_test_main.cc, which exits 77 (CTest "skipped") with no GPU.
# Every test knows the source tree's paths (RLHFD_SOURCE_DIR, RLHFD_FIXTURES_DIR,
# RLHFD_CONFIGS_DIR) and the virtualenv's python (RLHFD_PYTHON); DAEMONS: it starts real rlhfd
# processes, so it gets their paths (RLHFD_CONTROLLER_BIN, RLHFD_WORKER_BIN, RLHFD_CTL_BIN) and
# they are built before it.
function(rlhfd_test)
  cmake_parse_arguments(ARG "GPU;TORCH;DAEMONS;PARTS" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_include_directories(${ARG_NAME} PRIVATE ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
  target_compile_definitions(${ARG_NAME} PRIVATE
    RLHFD_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    RLHFD_FIXTURES_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures"
    RLHFD_CONFIGS_DIR="${CMAKE_SOURCE_DIR}/configs"
    RLHFD_PYTHON="${RLHFD_PYTHON}")
  if(ARG_DAEMONS)
    target_compile_definitions(${ARG_NAME} PRIVATE
      RLHFD_CONTROLLER_BIN="$<TARGET_FILE:rlhfd-controller>"
      RLHFD_WORKER_BIN="$<TARGET_FILE:rlhfd-worker>"
      RLHFD_CTL_BIN="$<TARGET_FILE:rlhfctl>")
    add_dependencies(${ARG_NAME} rlhfd-controller rlhfd-worker rlhfctl)
  endif()
  if(ARG_GPU)
    target_link_libraries(${ARG_NAME} PRIVATE rlhfd_gpu_test_main ${ARG_DEPS})
  else()
    target_link_libraries(${ARG_NAME} PRIVATE rlhfd_test_main ${ARG_DEPS})
  endif()
  if(ARG_TORCH OR ARG_GPU)
    rlhfd_use_torch(${ARG_NAME})
  endif()
  if(ARG_PARTS)
    return()
  endif()
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
  set(labels ${ARG_LABELS})
  if(ARG_GPU)
    list(APPEND labels gpu)
    set_tests_properties(${ARG_NAME} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
  if(labels)
    set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${labels}")
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES TIMEOUT 300)
endfunction()
