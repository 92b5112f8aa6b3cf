"""A few transformer training steps; with PYTORCH_NO_CUDA_MEMORY_CACHING=1 every
tensor goes through cudaMalloc/cudaFree, so under gpupool through the pool."""
import torch

torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=4).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(20):
    x = torch.randn(16, 128 + step * 8, 256, device="cuda")
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
torch.cuda.synchronize()
assert torch.isfinite(loss).item()
print(f"torch_smoke: 20 steps, loss {loss.item():.4f}")
