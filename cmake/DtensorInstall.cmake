# Installation and the package config are finished by the packaging work; this installs headers.
install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
