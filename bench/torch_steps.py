"""Times training steps of a small transformer whose sequence length changes
every step (the pattern that fragments a caching allocator). Prints one JSON
line: median milliseconds per step, and the peak bytes PyTorch's own
allocator reserved (0 when PYTORCH_NO_CUDA_MEMORY_CACHING=1 turns it off).
Run by bench/gpu_bench.py in three set-ups: PyTorch's allocator; no caching;
no caching under gpupool (whose report gives the reserved peak).
--side-stream: each step's input is made on a side stream, as a prefetching
loader makes it; asking for that one stream makes PyTorch create its stream
pool (32 non-blocking streams per priority level), which every gpupool
device barrier must then order."""
import json
import statistics
import sys
import time

import torch

args = [a for a in sys.argv[1:] if not a.startswith("--")]
steps = int(args[0]) if args else 60
side = torch.cuda.Stream() if "--side-stream" in sys.argv else None
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=8).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
times = []
for step in range(steps):
    shape = (8, 256 + (step * 37) % 512, 1024)
    if side is None:
        x = torch.randn(shape, device="cuda")
    else:
        with torch.cuda.stream(side):
            x = torch.randn(shape, device="cuda")
        torch.cuda.current_stream().wait_stream(side)
        x.record_stream(torch.cuda.current_stream())
    torch.cuda.synchronize()
    start = time.perf_counter()
    loss = model(x).pow(2).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    if step >= 5:  # the first steps load kernels and fill caches
        times.append(time.perf_counter() - start)
assert torch.isfinite(loss).item()
print(json.dumps({"ms_per_step": 1000 * statistics.median(times),
                  "torch_reserved_peak": torch.cuda.max_memory_reserved(),
                  "torch_allocated_peak": torch.cuda.max_memory_allocated()}))
