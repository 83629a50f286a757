# Case 21: io_uring_setup (syscall 425) with a valid request.
params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
emit({"io_uring_setup": in_child(lambda: syscall(425, 4, params)),
      "io_uring_enter": in_child(lambda: syscall(426, -1, 0, 0, 0, 0, 0)),
      "io_uring_register": in_child(lambda: syscall(427, -1, 0, 0, 0))})
