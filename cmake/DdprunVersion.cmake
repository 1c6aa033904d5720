# ddprun's version, from git when the project is configured (docs/INSTALL.md, "Versions").
#
#   cmake/version-base holds X.Y.Z. The commit that last changed it is version X.Y.Z; so is a
#   commit tagged vX.Y.Z (the nearer of the two counts, a tag on equal terms). N commits after
#   it, the version is the next patch release's development version:
#       PEP 440 (pip, ddprun.__version__)   X.Y.(Z+1).devN+g<hash>
#       Debian                               X.Y.(Z+1)~devN+g<hash>
#   Both sort above X.Y.Z and below X.Y.(Z+1), and by N between two commits of one branch.
#   Uncommitted changes do not change the version.
#   Without git (a source archive): the Version of an sdist's PKG-INFO, else 0.0.0+unknown,
#   with a warning. DDPRUN_VERSION (a CMake variable or the environment) overrides all of it:
#   X.Y.Z or X.Y.Z.devN[+local], as PEP 440 writes it.
#
# Included from the top CMakeLists.txt before project(): sets DDPRUN_VERSION_NUMERIC (X.Y.Z,
# for project()), DDPRUN_VERSION_PEP440, DDPRUN_VERSION_DEB and DDPRUN_VERSION_SOURCE (how
# it was found). As a script it prints them:
#   cmake -DDDPRUN_SOURCE_DIR=<tree> [-DDDPRUN_VERSION=...] -P cmake/DdprunVersion.cmake
#   -> pep440=...  deb=...  numeric=...  source=...   (one per line)

# Runs git in the source tree; OUT is empty when it fails.
function(_ddprun_git out)
  execute_process(COMMAND "${DDPRUN_GIT}" -C "${_ddprun_src}" ${ARGN}
                  OUTPUT_VARIABLE _o ERROR_QUIET RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0)
    set(_o "")
  endif()
  set(${out} "${_o}" PARENT_SCOPE)
endfunction()

# PEP 440 version (X.Y.Z[.devN][+local]) -> the three results; fails on anything else.
function(_ddprun_version_from_pep440 v source)
  if(NOT v MATCHES "^([0-9]+)\\.([0-9]+)\\.([0-9]+)(\\.dev([0-9]+))?(\\+([A-Za-z0-9.]+))?$")
    message(FATAL_ERROR "ddprun version '${v}' (${source}) is not X.Y.Z or X.Y.Z.devN[+local] "
                        "(PEP 440): set DDPRUN_VERSION to one, e.g. -DDDPRUN_VERSION=0.2.0")
  endif()
  set(deb "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}.${CMAKE_MATCH_3}")
  if(CMAKE_MATCH_4)
    string(APPEND deb "~dev${CMAKE_MATCH_5}")
  endif()
  if(CMAKE_MATCH_6)
    string(APPEND deb "+${CMAKE_MATCH_7}")
  endif()
  set(DDPRUN_VERSION_NUMERIC "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}.${CMAKE_MATCH_3}" PARENT_SCOPE)
  set(DDPRUN_VERSION_PEP440 "${v}" PARENT_SCOPE)
  set(DDPRUN_VERSION_DEB "${deb}" PARENT_SCOPE)
  set(DDPRUN_VERSION_SOURCE "${source}" PARENT_SCOPE)
endfunction()

# X.Y.Z and N commits after it at HASH -> the PEP 440 version.
function(_ddprun_dev_version out base n hash)
  if(n EQUAL 0)
    set(${out} "${base}" PARENT_SCOPE)
    return()
  endif()
  string(REPLACE "." ";" parts "${base}")
  list(GET parts 0 x)
  list(GET parts 1 y)
  list(GET parts 2 z)
  math(EXPR z "${z} + 1")
  set(${out} "${x}.${y}.${z}.dev${n}+g${hash}" PARENT_SCOPE)
endfunction()

# From git: the base file's last change or the nearest vX.Y.Z tag. OUT is empty without git.
function(_ddprun_version_from_git out source_out)
  set(${out} "" PARENT_SCOPE)
  if(NOT DDPRUN_GIT)
    return()
  endif()
  # Only a tree that is its own repository's top (a source archive unpacked inside another
  # repository is not versioned by that one).
  _ddprun_git(top rev-parse --show-toplevel)
  if(NOT top)
    return()
  endif()
  file(REAL_PATH "${top}" top)
  file(REAL_PATH "${_ddprun_src}" src)
  if(NOT top STREQUAL src)
    return()
  endif()
  _ddprun_git(hash rev-parse --short=10 HEAD)
  if(NOT hash)
    return()
  endif()
  file(STRINGS "${_ddprun_src}/cmake/version-base" base LIMIT_COUNT 1 REGEX "^[0-9]+\\.[0-9]+\\.[0-9]+$")
  if(NOT base)
    message(FATAL_ERROR "cmake/version-base must hold one version X.Y.Z")
  endif()
  _ddprun_git(base_commit log -1 --format=%H -- cmake/version-base)
  if(base_commit)
    _ddprun_git(n rev-list --count "${base_commit}..HEAD")
  else()  # not committed yet: every commit counts
    _ddprun_git(n rev-list --count HEAD)
  endif()
  set(how "cmake/version-base ${base}, ${n} commits after it")
  _ddprun_git(shallow rev-parse --is-shallow-repository)
  if(shallow STREQUAL "true")
    # A shallow clone's oldest commit seems to add every file: the count is unknown.
    message(WARNING "ddprun: ${_ddprun_src} is a shallow clone, so the commits since the version "
                    "base are not known: the version is a development version numbered 0. For the "
                    "real one: git fetch --unshallow")
    set(n 0)
    set(how "shallow clone, commits since cmake/version-base ${base} unknown")
    set(shallow_dev 1)
  endif()
  _ddprun_git(described describe --tags --long --abbrev=10 --match "v[0-9]*.[0-9]*.[0-9]*")
  if(described MATCHES "^v([0-9]+\\.[0-9]+\\.[0-9]+)-([0-9]+)-g[0-9a-f]+$" AND CMAKE_MATCH_2 LESS_EQUAL n)
    set(base "${CMAKE_MATCH_1}")
    set(n "${CMAKE_MATCH_2}")
    set(how "tag v${base}, ${n} commits after it")
    set(shallow_dev 0)
  endif()
  _ddprun_dev_version(v "${base}" "${n}" "${hash}")
  if(shallow_dev AND v STREQUAL base)
    _ddprun_dev_version(v "${base}" 1 "${hash}")
    string(REPLACE ".dev1+" ".dev0+" v "${v}")
  endif()
  set(${out} "${v}" PARENT_SCOPE)
  set(${source_out} "git: ${how}" PARENT_SCOPE)
endfunction()

function(ddprun_compute_version src)
  set(_ddprun_src "${src}")
  find_program(DDPRUN_GIT git)
  if(DEFINED DDPRUN_VERSION AND NOT DDPRUN_VERSION STREQUAL "")
    _ddprun_version_from_pep440("${DDPRUN_VERSION}" "DDPRUN_VERSION")
  elseif(NOT "$ENV{DDPRUN_VERSION}" STREQUAL "")
    _ddprun_version_from_pep440("$ENV{DDPRUN_VERSION}" "environment DDPRUN_VERSION")
  else()
    _ddprun_version_from_git(v how)
    if(v)
      _ddprun_version_from_pep440("${v}" "${how}")
    elseif(EXISTS "${src}/PKG-INFO")
      file(STRINGS "${src}/PKG-INFO" v LIMIT_COUNT 1 REGEX "^Version: ")
      string(REGEX REPLACE "^Version: *" "" v "${v}")
      _ddprun_version_from_pep440("${v}" "PKG-INFO of the source distribution")
    else()
      message(WARNING "ddprun: ${src} is no git clone and no source distribution: the version is "
                      "0.0.0+unknown. Build from a git clone, or set it: -DDDPRUN_VERSION=X.Y.Z")
      _ddprun_version_from_pep440("0.0.0+unknown" "unknown: no git, no PKG-INFO")
    endif()
  endif()
  foreach(v NUMERIC PEP440 DEB SOURCE)
    set(DDPRUN_VERSION_${v} "${DDPRUN_VERSION_${v}}" PARENT_SCOPE)
  endforeach()
  # Configure again when HEAD moves (a commit, a checkout) or the base changes.
  if(CMAKE_PROJECT_NAME OR NOT CMAKE_SCRIPT_MODE_FILE)
    _ddprun_git(gitdir rev-parse --absolute-git-dir)
    foreach(f "${src}/cmake/version-base" "${gitdir}/HEAD" "${gitdir}/logs/HEAD")
      if(gitdir AND EXISTS "${f}")
        set_property(DIRECTORY "${src}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${f}")
      endif()
    endforeach()
  endif()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE AND CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT DDPRUN_SOURCE_DIR)
    get_filename_component(DDPRUN_SOURCE_DIR "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
  endif()
  ddprun_compute_version("${DDPRUN_SOURCE_DIR}")
  execute_process(COMMAND "${CMAKE_COMMAND}" -E echo "pep440=${DDPRUN_VERSION_PEP440}")
  execute_process(COMMAND "${CMAKE_COMMAND}" -E echo "deb=${DDPRUN_VERSION_DEB}")
  execute_process(COMMAND "${CMAKE_COMMAND}" -E echo "numeric=${DDPRUN_VERSION_NUMERIC}")
  execute_process(COMMAND "${CMAKE_COMMAND}" -E echo "source=${DDPRUN_VERSION_SOURCE}")
endif()
