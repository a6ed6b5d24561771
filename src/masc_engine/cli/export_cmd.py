"""``masc-export``: build a validated bundle from a SigLIP2 checkpoint (needs the export extra)."""

from __future__ import annotations

import sys

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "-m", default="siglip2-so400m", show_default=True,
              help="Hugging Face id (google/siglip2-so400m-patch16-naflex), short name (siglip2-so400m, "
                   "siglip2-base, siglip2-base-512), local checkpoint directory, or a random-weight test "
                   "model: random:tiny-naflex, random:tiny-fixed, random:base-naflex, random:so400m-naflex.")
@click.option("--out", "-o", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Bundle directory to write.")
@click.option("--max-num-patches", type=click.IntRange(1, 16384), default=None,
              help="NaFlex patch budget (default 1024, the paper's).")
@click.option("--revision", default=None, help="Hub revision (commit, tag or branch) to pin.")
def main(model: str, out_dir: str, max_num_patches: int | None, revision: str | None) -> None:
    """Export a SigLIP2 checkpoint to ONNX graphs + manifest, validated against PyTorch."""
    try:
        from ..export.exporter import export_bundle
    except ImportError as e:  # torch / transformers / onnx missing
        raise click.ClickException(
            f"masc-export needs the export extra ({e.name} is missing): pip install 'masc-engine[export]'"
        ) from e
    from ..errors import MascEngineError

    try:
        export_bundle(model, out_dir, max_num_patches=max_num_patches, revision=revision,
                      log=lambda s: click.echo(s, err=True))
    except MascEngineError as e:
        raise click.ClickException(str(e)) from e


if __name__ == "__main__":
    sys.exit(main())
