"""``gpufrag dev-cluster up``'s wiring for the node's image: ``--no-image`` is refused without
``--node``, a detached start hands the same choices to its background process, and the image
store kept between runs drops exactly the project's stale images. Building and importing the
image itself (``Node.import_project_image``, the same call ``up --node`` makes) runs in the
node tests' ``gpufrag_image`` fixture (tests/e2e/node/conftest.py).
"""

from __future__ import annotations

import argparse

import pytest

from devkit import cli
from devkit.image import IMAGE_NAME
from devkit.node import stale_image_refs
from gpufrag.errors import EXIT_BAD_INPUT


def test_no_image_without_a_node_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["up", "--no-image"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "--no-image applies only with --node" in err and "Traceback" not in err


@pytest.mark.parametrize("flags", [["--node"], ["--node", "--no-image"], [],
                                   ["--gpu-nodes=2", "--binary=/x/cluster", "--timeout-s=30"]])
def test_a_detached_up_passes_its_choices_on(flags: list[str]) -> None:
    parser = cli._parser()
    args = parser.parse_args(["up", "--detach", *flags])
    command = cli._detached_command(args)
    assert command[1:4] == ["-m", "devkit.cli", "up"]
    child = parser.parse_args(command[3:])
    assert child.quiet_wait and not child.detach

    def choices(ns: argparse.Namespace) -> dict[str, object]:
        return {k: v for k, v in vars(ns).items() if k not in ("detach", "quiet_wait")}

    assert choices(child) == choices(args)


# What `ctr -n k8s.io images ls` printed on the node (columns trimmed to what is read).
LISTING = f"""REF TYPE DIGEST SIZE PLATFORMS LABELS
gpufrag.local/busybox:1 application/vnd.oci.image.manifest.v1+json sha256:b1 1.1MiB linux/amd64 -
{IMAGE_NAME}:new application/vnd.oci.image.manifest.v1+json sha256:n 188MiB linux/amd64 -
{IMAGE_NAME}:old application/vnd.oci.image.manifest.v1+json sha256:o 188MiB linux/amd64 -
{IMAGE_NAME}:older application/vnd.oci.image.manifest.v1+json sha256:o2 188MiB linux/amd64 -
{IMAGE_NAME}:same application/vnd.oci.image.manifest.v1+json sha256:n 188MiB linux/amd64 -
sha256:cfgbusybox application/vnd.oci.image.manifest.v1+json sha256:b1 1.1MiB linux/amd64 -
sha256:cfgnew application/vnd.oci.image.manifest.v1+json sha256:n 188MiB linux/amd64 -
sha256:cfgold application/vnd.oci.image.manifest.v1+json sha256:o 188MiB linux/amd64 -
sha256:cfgolder application/vnd.oci.image.manifest.v1+json sha256:o2 188MiB linux/amd64 -
"""


def test_the_kept_store_drops_stale_project_images_and_their_ids() -> None:
    keep = {f"{IMAGE_NAME}:new", f"{IMAGE_NAME}:old"}
    # :older and its CRI id go; :same is not kept but shares :new's manifest (removing it
    # would free nothing), so it stays, and so do the busybox image and every kept id.
    assert stale_image_refs(LISTING, IMAGE_NAME, keep) == [f"{IMAGE_NAME}:older",
                                                           "sha256:cfgolder"]
    assert stale_image_refs(LISTING, IMAGE_NAME, {f"{IMAGE_NAME}:new"}) == [
        f"{IMAGE_NAME}:old", f"{IMAGE_NAME}:older", "sha256:cfgold", "sha256:cfgolder"]
    assert stale_image_refs(LISTING.splitlines()[0], IMAGE_NAME, keep) == []
