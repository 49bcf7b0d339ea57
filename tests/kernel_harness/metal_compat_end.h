// Ends the Metal dialect of metal_compat.h so the harness driver that follows
// the kernels can use ordinary C++ (std::thread needs the word `thread`).
#undef device
#undef constant
#undef thread
#undef threadgroup
