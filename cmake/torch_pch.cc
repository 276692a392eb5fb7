// Translation unit that owns the precompiled LibTorch header.
