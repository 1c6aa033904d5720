# Where installed programs and libraries look for their libraries (RUNPATH), so that an
# install prefix can be moved, copied or packed into a wheel as it is:
#   - $ORIGIN/<bin -> lib>: ddprun, ddprund and train find libddprun_worker beside them,
#     unless the library folder is one the dynamic linker searches anyway (a /usr install,
#     e.g. a distribution package, gets no RUNPATH);
#   - in a wheel (SKBUILD, set by scikit-build-core): also the folders of the nvidia-* wheels
#     that PyTorch's CUDA wheels install next to it (site-packages/nvidia/...), so CUDA and
#     NCCL come from the environment's PyTorch, else from the system. The package lives in
#     site-packages/ddprun/{bin,lib}, two levels below site-packages. scripts/build_wheel.sh
#     puts the same folders back after auditwheel where they are missing.
include(GNUInstallDirs)
set(DDPRUN_WHEEL_NVIDIA_RPATH
    "$ORIGIN/../../nvidia/nccl/lib" "$ORIGIN/../../nvidia/cu13/lib" "$ORIGIN/../../nvidia/cuda_runtime/lib"
    "$ORIGIN/../../nvidia/cublas/lib")
file(RELATIVE_PATH _ddprun_bin_to_lib "${CMAKE_INSTALL_FULL_BINDIR}" "${CMAKE_INSTALL_FULL_LIBDIR}")
set(_ddprun_system_libdirs ${CMAKE_PLATFORM_IMPLICIT_LINK_DIRECTORIES} ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES})
list(FIND _ddprun_system_libdirs "${CMAKE_INSTALL_FULL_LIBDIR}" _ddprun_libdir_is_system)
if(_ddprun_libdir_is_system EQUAL -1 AND NOT DEFINED CMAKE_INSTALL_RPATH)
  set(CMAKE_INSTALL_RPATH "$ORIGIN/${_ddprun_bin_to_lib}")
  if(SKBUILD)
    list(APPEND CMAKE_INSTALL_RPATH ${DDPRUN_WHEEL_NVIDIA_RPATH})
  endif()
endif()
