# cmake/python_wheel.cmake — the install rule of the Python wheel: included
# when scikit-build-core drives the build (SKBUILD, `pip install ./python`,
# which installs only the component "python"). libferry.so goes beside the
# package's modules (ferry/libferry.so), one file (no version links: a wheel
# holds no symlinks), with the run path to the libraries outside the
# system's folders it was linked with (OpenMPI's) and to the CUDA toolkit's
# (CMake counts it implicit: without it libcudart is found only where the
# toolkit is on the loader's path).
set_property(TARGET ferry PROPERTY VERSION)
set_property(TARGET ferry PROPERTY SOVERSION)
set_target_properties(ferry PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
if(FERRY_HAVE_CUDA)
  set_property(TARGET ferry APPEND PROPERTY INSTALL_RPATH "${CUDAToolkit_LIBRARY_DIR}")
endif()
install(TARGETS ferry LIBRARY DESTINATION ferry COMPONENT python)
