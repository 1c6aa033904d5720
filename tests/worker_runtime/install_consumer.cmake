# ctest worker.install: installs the ddprun_worker component of a build tree into a fresh
# temporary prefix, then configures, builds and runs tests/worker_runtime/consumer against it.
#   cmake -DBUILD_DIR=... -DCONSUMER_DIR=... -DWORK_DIR=... -P install_consumer.cmake
foreach(v BUILD_DIR CONSUMER_DIR WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "install_consumer.cmake: -D${v}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${name}: ok\n${out}")
endfunction()
step("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --component ddprun_worker --prefix ${WORK_DIR}/prefix)
# Only the prefix: nothing of the source or build tree may leak into the consumer.
step("configure consumer" ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -DCMAKE_BUILD_TYPE=Debug
     -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
step("build consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build -j2)
step("run consumer" ${WORK_DIR}/build/consumer)
file(REMOVE_RECURSE ${WORK_DIR})
