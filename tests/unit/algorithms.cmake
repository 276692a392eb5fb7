# Unit tests of the algorithms area (included from CMakeLists.txt).
