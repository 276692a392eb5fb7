# Unit tests of the transport area (included from CMakeLists.txt).
