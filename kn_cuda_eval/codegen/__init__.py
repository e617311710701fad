"""The one code generator of both backends: the expression table (`exprs`: an op and dtype to a
C expression), the program printer (`printer`), the device-neutral descriptions of the row kernels
(`rows`: softmax, layernorm, reductions) and of the attention arithmetic (`attention`), strict
templates and an indented writer (`template`) and the on-disk cache (`cache`). It imports the
plan's records, never a backend."""
