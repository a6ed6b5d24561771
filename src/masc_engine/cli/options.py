"""Command-line options that mean the same in several commands (masc-run, masc-serve, masc-rank):
one definition each, so their ranges, defaults and help cannot drift apart."""

from __future__ import annotations

import click

#: ONNX Runtime intra-op threads.
threads_option = click.option("--threads", type=click.IntRange(0, 1024), default=0, show_default=True,
                              help="ONNX Runtime intra-op threads (0: ONNX Runtime's default).")

#: NaFlex patch budget override.
max_num_patches_option = click.option("--max-num-patches", type=click.IntRange(1, 16384), default=None,
                                      help="Override the bundle's NaFlex patch budget.")

#: EXIF orientation policy (runtime/io.py).
exif_option = click.option("--exif", type=click.Choice(["apply", "ignore"]), default="apply", show_default=True,
                           help="EXIF orientation: apply to image and mask alike, or ignore (read stored pixels, "
                                "as masc-metric does).")

#: How far a mask's size may be off its image's before it is refused.
mask_size_tolerance_option = click.option(
    "--mask-size-tolerance", type=click.IntRange(0, 64), default=0, show_default=True,
    help="Stretch a mask at most this many pixels off its image's size instead of refusing it.")
