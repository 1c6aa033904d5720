# The programs' version, and the Debian packages (CPack, DEB generator): after a build,
#   cpack --config build/CPackConfig.cmake -B build/packages
# gives three packages, split as Debian does:
#   ddprun                the programs ddprun and ddprund, their man pages ddprun(1) and
#                         ddprund(8) made from --help by help2man, bash completion, and
#                         ddprund.service with /etc/default/ddprund (docs/ADMIN.md)
#   libddprun-worker0     libddprun_worker.so.0, the C++ worker runtime
#   libddprun-worker-dev  its headers, CMake package and the libddprun_worker.so link
# each with /usr/share/doc/<package>/copyright (machine-readable) and changelog.gz.
# The files only the packages install are the install components deb*, left out of a plain
# `cmake --install` (it would write to /etc).

# ---- --version (cmake/DdprunVersion.cmake) ---------------------------------------------------
# A header forced into the two files that print it (-include): the flags stay the same from one
# commit to the next, so a new version recompiles those two files only (a changed definition
# on the command line would recompile every file of their targets).
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/gen/ddprun_version_def.h @ONLY
     CONTENT "#define DDPRUN_VERSION \"@DDPRUN_VERSION_PEP440@\"\n")
if(TARGET ddprun_launcher_core)
  set_source_files_properties(${PROJECT_SOURCE_DIR}/launcher/src/options/flags.cpp TARGET_DIRECTORY ddprun_launcher_core
    PROPERTIES COMPILE_OPTIONS "-include;${PROJECT_BINARY_DIR}/gen/ddprun_version_def.h")
endif()
set_source_files_properties(${PROJECT_SOURCE_DIR}/rendezvous/tools/ddprund_main.cpp TARGET_DIRECTORY ddprund
  PROPERTIES COMPILE_OPTIONS "-include;${PROJECT_BINARY_DIR}/gen/ddprun_version_def.h")
# For scripts (scripts/build_wheel.sh --from-build) and the Python package (ddprun.__version__,
# component ddprun_python: the wheel installs it into the package).
file(WRITE ${PROJECT_BINARY_DIR}/ddprun-version.txt "${DDPRUN_VERSION_PEP440}\n")
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/python/_version.py
     CONTENT "# Written by the build (cmake/DdprunVersion.cmake).\n__version__ = \"@DDPRUN_VERSION_PEP440@\"\n" @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/python/_version.py DESTINATION . COMPONENT ddprun_python EXCLUDE_FROM_ALL)

set(_pkg ${PROJECT_SOURCE_DIR}/packaging)
set(_gen ${PROJECT_BINARY_DIR}/packaging)

# ---- man pages, from --help at build time --------------------------------------------------
find_program(DDPRUN_HELP2MAN help2man)
if(DDPRUN_HELP2MAN)
  # The program's --help, with the sections of packaging/man/<program>.h2m (FILES, SEE ALSO).
  function(ddprun_man_page target section what)
    set(page ${_gen}/man/${target}.${section})
    set(out ${page}.gz)
    add_custom_command(OUTPUT ${out}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${_gen}/man
      COMMAND ${DDPRUN_HELP2MAN} --no-info --section=${section} --name=${what} --source=ddprun
              --include=${_pkg}/man/${target}.h2m --output=${page} $<TARGET_FILE:${target}>
      COMMAND gzip -9nf ${page}
      DEPENDS ${target} ${_pkg}/man/${target}.h2m
      COMMENT "help2man: ${target}(${section})"
      VERBATIM)
    add_custom_target(${target}_man ALL DEPENDS ${out})
    install(FILES ${out} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section} COMPONENT deb EXCLUDE_FROM_ALL)
  endfunction()
  if(TARGET ddprun)
    ddprun_man_page(ddprun 1 "a torchrun-compatible launcher for distributed training")
  endif()
  ddprun_man_page(ddprund 8 "a standing rendezvous and TCPStore daemon for ddprun and PyTorch")
else()
  message(STATUS "help2man not found: no man pages, and the .deb (package.deb.* tests) will lack them; "
                 "scripts/setup_deps.sh installs it")
endif()

# ---- the rest of the package's own files ---------------------------------------------------
# The completion reads each program's --help when first used: one file, under both names.
foreach(prog ddprun ddprund)
  install(FILES ${_pkg}/bash-completion/ddprun DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
          RENAME ${prog} COMPONENT deb EXCLUDE_FROM_ALL)
endforeach()
install(FILES ${_pkg}/systemd/ddprund.service DESTINATION lib/systemd/system COMPONENT deb EXCLUDE_FROM_ALL)
install(PROGRAMS ${_pkg}/systemd/ddprund-service DESTINATION lib/ddprun COMPONENT deb EXCLUDE_FROM_ALL)
install(FILES ${_pkg}/default/ddprund DESTINATION /etc/default COMPONENT deb EXCLUDE_FROM_ALL)
install(FILES ${PROJECT_SOURCE_DIR}/docs/ADMIN.md DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/ddprun COMPONENT deb EXCLUDE_FROM_ALL)

# ---- licenses and changelog, per package -----------------------------------------------------
# debian/copyright in the machine-readable format, and a changelog naming the version and the
# commit it was built from (a new version, a new entry: what the upgrade test compares).
set(DDPRUN_DEB_MAINTAINER "ddprun developers <dev@ddprun.invalid>" CACHE STRING
    "Maintainer field of the .debs (name <address>): set it to whoever publishes them")
if(DDPRUN_DEB_MAINTAINER MATCHES "@localhost>")  # an older build folder's default
  set(DDPRUN_DEB_MAINTAINER "ddprun developers <dev@ddprun.invalid>" CACHE STRING "" FORCE)
endif()
string(TIMESTAMP _deb_date "%a, %d %b %Y %H:%M:%S +0000" UTC)  # SOURCE_DATE_EPOCH if set
set(_deb_changes "Built from ${DDPRUN_VERSION_SOURCE}.")
file(CONFIGURE OUTPUT ${_gen}/deb/changelog @ONLY CONTENT
"ddprun (@DDPRUN_VERSION_DEB@) unstable; urgency=medium

  * @_deb_changes@

 -- @DDPRUN_DEB_MAINTAINER@  @_deb_date@
")
add_custom_command(OUTPUT ${_gen}/deb/changelog.gz
  COMMAND gzip -9nc ${_gen}/deb/changelog > ${_gen}/deb/changelog.gz
  DEPENDS ${_gen}/deb/changelog
  COMMENT "changelog.gz for the .debs")
add_custom_target(ddprun_deb_changelog ALL DEPENDS ${_gen}/deb/changelog.gz)
foreach(p ddprun:deb libddprun-worker0:deb_worker libddprun-worker-dev:deb_worker_dev)
  string(REPLACE ":" ";" p "${p}")
  list(GET p 0 _name)
  list(GET p 1 _comp)
  install(FILES ${_pkg}/deb/copyright ${_gen}/deb/changelog.gz DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${_name}
          COMPONENT ${_comp} EXCLUDE_FROM_ALL)
endforeach()

# ---- CPack -----------------------------------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VERSION ${DDPRUN_VERSION_DEB})
# Installed with DESTDIR into the package's tree, so that /etc/default/ddprund lands there too.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
# Three packages from the install components (the LibTorch layer is left out: it needs a
# LibTorch that no Debian package provides).
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)
set(CPACK_COMPONENTS_ALL Unspecified deb)
set(CPACK_COMPONENT_UNSPECIFIED_GROUP programs)
set(CPACK_COMPONENT_DEB_GROUP programs)
if(TARGET ddprun_worker)
  list(APPEND CPACK_COMPONENTS_ALL ddprun_worker deb_worker ddprun_worker_dev deb_worker_dev)
  set(CPACK_COMPONENT_DDPRUN_WORKER_GROUP runtime)
  set(CPACK_COMPONENT_DEB_WORKER_GROUP runtime)
  set(CPACK_COMPONENT_DDPRUN_WORKER_DEV_GROUP dev)
  set(CPACK_COMPONENT_DEB_WORKER_DEV_GROUP dev)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_VERSION ${DDPRUN_VERSION_DEB})
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${DDPRUN_DEB_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Depends from the libraries the binaries link (dpkg-shlibdeps). A CUDA build links the CUDA
# runtime statically and loads NCCL when a worker asks for the GPU: neither is a dependency
# (no Debian package has them); GPU machines install NVIDIA's (docs/ADMIN.md).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
string(CONCAT _about_programs
    "ddprun starts and supervises distributed training workers as torchrun\n"
    "does, with the same flags and environment. ddprund is a standing\n"
    "rendezvous and TCPStore daemon for multi-node jobs, run as the ddprund\n"
    "service.")
string(CONCAT _about_lib
    "libddprun_worker is a C++ runtime for data-parallel training workers\n"
    "started by ddprun or torchrun: rendezvous through the TCPStore, gradient\n"
    "all-reduce over Gloo (and NCCL where built with CUDA), bucketed and\n"
    "overlapped with compute.")
set(CPACK_DEBIAN_PROGRAMS_PACKAGE_NAME ddprun)
set(CPACK_DEBIAN_PROGRAMS_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PROGRAMS_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_PROGRAMS_PACKAGE_RECOMMENDS "bash-completion")
set(CPACK_DEBIAN_PROGRAMS_DESCRIPTION
    "torchrun-compatible launcher and rendezvous daemon for PyTorch\n${_about_programs}")
set(CPACK_DEBIAN_PROGRAMS_PACKAGE_CONTROL_EXTRA
    ${_pkg}/deb/postinst ${_pkg}/deb/prerm ${_pkg}/deb/postrm ${_pkg}/deb/conffiles)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libddprun-worker0)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION "C++ runtime for data-parallel training workers\n${_about_lib}")
# The shlibs file (dpkg-shlibdeps of packages linking the library) and the ldconfig trigger.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${_pkg}/deb/triggers)
# CPack also writes a postinst and postrm that call ldconfig into a package with a library in
# /usr/lib; Debian's way is the trigger above alone: this takes them out again after packing.
set(CPACK_POST_BUILD_SCRIPTS ${PROJECT_SOURCE_DIR}/cmake/DebDropLdconfigScripts.cmake)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libddprun-worker-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libddprun-worker0 (= ${DDPRUN_VERSION_DEB})")
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_DEV_DESCRIPTION "C++ runtime for data-parallel training workers (development files)\n${_about_lib}\n\nThis package has the headers and the CMake package for\nfind_package(ddprun_worker).")
include(CPack)

if(DDPRUN_BUILD_TESTS AND TARGET ddprun)
  add_subdirectory(tests/deb)
endif()
