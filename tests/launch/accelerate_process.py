"""A worker using Accelerate's PartialState and torch.distributed: joins and all-reduces."""
import torch
import torch.distributed as dist
from accelerate import PartialState

state = PartialState(cpu=True)
t = torch.tensor([float(state.process_index + 1)])
dist.all_reduce(t)
print(f"ACCEL process {state.process_index} of {state.num_processes} sum {t.item():g}", flush=True)
