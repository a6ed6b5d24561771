import io, sys, resource, os
import numpy as np
from PIL import Image
kind, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
arr = np.zeros((n, n, 3) if mode == "RGB" else (n, n), np.uint8)
if mode == "I;16": arr = np.zeros((n, n), np.uint16)
b = io.BytesIO(); Image.fromarray(arr, mode if mode != "I;16" else None).save(b, "PNG"); data = b.getvalue(); del arr
from masc_engine.runtime.io import open_image, decode_cost, image_from_opened, mask_from_opened
from masc_engine.runtime.masks import mask_coverage, mask_to_patch_grid
from masc_engine.runtime.preprocess import ImageSettings, preprocess_image
s = ImageSettings("naflex", 16, 1024, None, "bilinear", 1/255, (0.5,)*3, (0.5,)*3)
import gc; gc.collect()
def hwm():
    for l in open("/proc/self/status"):
        if l.startswith("VmHWM"): return int(l.split()[1]) * 1024
def rss():
    for l in open("/proc/self/status"):
        if l.startswith("VmRSS"): return int(l.split()[1]) * 1024
# reset HWM
open("/proc/self/clear_refs", "w").write("5")
base = rss()
im = open_image(data, "x", kind)
cost = decode_cost(im, kind)
if kind == "image":
    rgb, notes = image_from_opened(im, "x")
    pre = preprocess_image(rgb, s); del rgb
else:
    m = mask_from_opened(im, "x")
    c = mask_coverage(m); w = mask_to_patch_grid(m, (32, 32)); del m
peak = hwm() - base
print(f"{kind} {mode} {n}x{n}: peak {peak/2**20:.0f} MiB, estimate {cost/2**20:.0f} MiB, per px {peak/n/n:.1f}")
