"""Real photos for validation and calibration, offline: scikit-image's bundled sample data.

``copy_sample_images(folder)`` copies the photos below from the installed
scikit-image wheel into ``folder`` (skipping files already there) and returns
their paths; no network. They are public domain or CC0 (see
``data/images/README.md`` and each ``skimage.data`` function's docstring).

    python -m models.sample_images data/images        # the default six
    python -m models.sample_images /tmp/imgs --count 2
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
from pathlib import Path

# file in skimage/data -> (what it shows, licence as skimage documents it); ~1.1 MB together.
SAMPLES = {
    "chelsea.png": ("Chelsea the cat", "CC0, photographer Stefan van der Walt"),
    "coffee.png": ("a cup of coffee", "CC0, photographer Rachel Michetti"),
    "rocket.jpg": ("Falcon 9 launch (DSCOVR)", "public domain, released by SpaceX"),
    "camera.png": ("a photographer with a tripod camera (grayscale)", "CC0, photographer Lav Varshney"),
    "clock_motion.png": (
        "a motion-blurred wall clock (grayscale)",
        "public domain, released by the photographer Stefan van der Walt",
    ),
    "brick.png": ("a brick wall texture (grayscale)", "CC0, from CC0Textures (Bricks25)"),
}


def skimage_data_dir() -> Path:
    import skimage

    return Path(skimage.__file__).resolve().parent / "data"


def copy_sample_images(folder: Path, count: int | None = None, names=None) -> list:
    """Copy ``count`` (default all) of ``names`` (default SAMPLES) into ``folder`` if absent."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    source = skimage_data_dir()
    chosen = list(names or SAMPLES)[:count]
    out = []
    for name in chosen:
        target = folder / name
        if not target.exists():
            shutil.copyfile(source / name, target)
        out.append(target)
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--count", type=int, default=None)
    args = parser.parse_args(argv)
    for path in copy_sample_images(args.folder, args.count):
        print(f"{path}  {path.stat().st_size:>8} B  sha256 {sha256(path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
