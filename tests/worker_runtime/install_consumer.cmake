# ctest worker.install / libtorch.install: installs components of a build tree into a fresh
# temporary prefix, then configures, builds and runs an out-of-tree consumer against it.
#   cmake -DBUILD_DIR=... -DCONSUMER_DIR=... -DWORK_DIR=... [-DCOMPONENTS=a|b] [-DLAUNCH=cmd|args]
#         [-DCONFIGURE_ARGS=-Dx=y|...] -P install_consumer.cmake
# COMPONENTS: install components ('|'-separated; default ddprun_worker|ddprun_worker_dev). LAUNCH: a command
# ('|'-separated) the consumer program is run under, e.g. a launcher starting several ranks.
foreach(v BUILD_DIR CONSUMER_DIR WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "install_consumer.cmake: -D${v}=... is required")
  endif()
endforeach()
if(NOT DEFINED COMPONENTS)
  set(COMPONENTS ddprun_worker ddprun_worker_dev)
endif()
string(REPLACE "|" ";" COMPONENTS "${COMPONENTS}")
string(REPLACE "|" ";" LAUNCH "${LAUNCH}")
string(REPLACE "|" ";" CONFIGURE_ARGS "${CONFIGURE_ARGS}")
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${name}: ok\n${out}")
endfunction()
foreach(c IN LISTS COMPONENTS)
  step("install ${c}" ${CMAKE_COMMAND} --install ${BUILD_DIR} --component ${c} --prefix ${WORK_DIR}/prefix)
endforeach()
# Only the prefix: nothing of the source or build tree may leak into the consumer.
step("configure consumer" ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -DCMAKE_BUILD_TYPE=Debug
     -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON ${CONFIGURE_ARGS})
step("build consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build -j2)
step("run consumer" ${LAUNCH} ${WORK_DIR}/build/consumer)
file(REMOVE_RECURSE ${WORK_DIR})
