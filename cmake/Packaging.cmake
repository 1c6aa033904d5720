# The programs' version, and the Debian package (CPack, DEB generator): after a build,
#   cpack --config build/CPackConfig.cmake -B build/packages
# gives ddprun_<version>_<arch>.deb with ddprun and ddprund, libddprun_worker with its headers
# and CMake package, the man pages ddprun(1) and ddprund(8) made from --help by help2man, bash
# completion, and ddprund.service with /etc/default/ddprund (docs/ADMIN.md).
# The files only the package installs are the install component `deb`, left out of a plain
# `cmake --install` (it would write to /etc).

# ---- --version -----------------------------------------------------------------------------
if(TARGET ddprun_launcher_core)
  target_compile_definitions(ddprun_launcher_core PRIVATE DDPRUN_VERSION="${PROJECT_VERSION}")
endif()
target_compile_definitions(ddprund PRIVATE DDPRUN_VERSION="${PROJECT_VERSION}")

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
install(FILES ${PROJECT_SOURCE_DIR}/docs/ADMIN.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT deb EXCLUDE_FROM_ALL)

# ---- CPack -----------------------------------------------------------------------------------
set(DDPRUN_DEB_MAINTAINER "ddprun maintainers <root@localhost>" CACHE STRING "Maintainer field of the .deb")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "torchrun-compatible launcher, rendezvous daemon and C++ DDP runtime")
string(CONCAT CPACK_PACKAGE_DESCRIPTION
    "ddprun starts and supervises distributed training workers as torchrun does, with the same flags "
    "and environment. ddprund is a standing rendezvous and TCPStore daemon for multi-node jobs, run as "
    "the ddprund service. libddprun_worker is a C++ runtime for data-parallel training workers.")
# Installed with DESTDIR into the package's tree, so that /etc/default/ddprund lands there too.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
# One package: the programs (component Unspecified), the library with its headers and CMake
# package, and the files above. The LibTorch layer is left out: it needs a LibTorch that no
# Debian package provides.
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_COMPONENTS_ALL Unspecified deb)
if(TARGET ddprun_worker)
  list(APPEND CPACK_COMPONENTS_ALL ddprun_worker)
endif()
set(CPACK_DEBIAN_PACKAGE_NAME ddprun)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${DDPRUN_DEB_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION net)
# Depends from the libraries the binaries link (dpkg-shlibdeps). CUDA and NCCL, linked when
# the build found them, belong to no Debian package and are left out: install them first.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "bash-completion")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${_pkg}/deb/postinst ${_pkg}/deb/prerm ${_pkg}/deb/postrm ${_pkg}/deb/conffiles ${_pkg}/deb/triggers)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)

if(DDPRUN_BUILD_TESTS AND TARGET ddprun)
  add_subdirectory(tests/deb)
endif()
