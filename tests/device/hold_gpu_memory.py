"""A second tenant on the GPU: holds memory until killed. `hold N` takes N GiB; `leave N` takes
all but N GiB of what is free. Prints "held" once the memory is allocated and touched."""

import sys
import time

import torch

GIB = 1 << 30
mode, amount = sys.argv[1], float(sys.argv[2])
free, total = torch.cuda.mem_get_info()
nbytes = int(amount * GIB) if mode == "hold" else free - int(amount * GIB)
block = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
block.fill_(1)
torch.cuda.synchronize()
print("held", nbytes, "bytes; free, total now:", torch.cuda.mem_get_info(), flush=True)
time.sleep(3600)
