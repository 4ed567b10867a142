# Helpers shared by tests, examples and benchmarks.

# dtensor_enable_sanitizers("address;undefined") — compile and link what follows with them.
function(dtensor_enable_sanitizers list)
  set(flags "")
  foreach(s IN LISTS list)
    string(APPEND flags " -fsanitize=${s}")
  endforeach()
  string(APPEND flags " -fno-omit-frame-pointer -fno-sanitize-recover=undefined")
  set(CMAKE_CXX_FLAGS "${CMAKE_CXX_FLAGS} ${flags}" PARENT_SCOPE)
  set(CMAKE_EXE_LINKER_FLAGS "${CMAKE_EXE_LINKER_FLAGS} ${flags}" PARENT_SCOPE)
endfunction()

# Warnings we hold our own code to (errors with DTENSOR_WERROR, as CI builds).
function(dtensor_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>)
  if(DTENSOR_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()
