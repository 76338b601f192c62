"""A service's start-up probe: GPU memory through nvidia-smi, and TF32 matmuls switched on."""
import os
import subprocess

import torch

MEMORY = subprocess.run("nvidia-smi -q -d MEMORY", shell=True, capture_output=True).stdout  # expect: RP215
NAMES = os.popen("nvidia-smi --query-gpu=name --format=csv").read()  # expect: RP215
torch.backends.cuda.matmul.allow_tf32 = True  # expect: RP228
torch.set_float32_matmul_precision("high")  # expect: RP228
torch.backends.cudnn.allow_tf32 = False
