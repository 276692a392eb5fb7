# Unit tests of the coordinator area (included from CMakeLists.txt).
