// cuda_fp16.h for the host: the software half of cuda_host.h
#include "cuda_host.h"
