"""Where the offline data sets' inputs are (Twemoji, Fashion-MNIST, Tux Paint, GCompris) and whether building
them shows progress bars: one :class:`DataSources`, made by the entry point from its Settings (:func:`configure`).

A data set is built wherever it is first needed (``engine.data.builders.ensure_built``, deep inside trainers and
evaluations), so the folders travel as this one process-wide value rather than through every function between
the entry point and the build; nothing here reads the environment. Until an entry point configures it, the
install locations (:data:`DataSources` defaults) hold.
"""
from __future__ import annotations

from dataclasses import dataclass

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"  # where the Debian package dataset-fashion-mnist installs
TUXPAINT_STAMPS = "/usr/share/tuxpaint/stamps"  # Debian tuxpaint-stamps-default
GCOMPRIS_RCC = "/usr/share/gcompris-qt/rcc"  # Debian gcompris-qt-data


@dataclass(frozen=True)
class DataSources:
    twemoji_dir: str = ""  # CIS_TWEMOJI_DIR: an unpacked npm package; "" = the one installed into the cache
    fashion_mnist_dir: str = FASHION_MNIST_DIR  # CIS_FASHION_MNIST_DIR
    tuxpaint_stamps: str = TUXPAINT_STAMPS  # CIS_TUXPAINT_STAMPS
    gcompris_rcc: str = GCOMPRIS_RCC  # CIS_GCOMPRIS_RCC
    progress: bool = False  # CIS_PROGRESS: bars even when stderr is not a terminal

    @classmethod
    def from_settings(cls, settings) -> "DataSources":
        """The fields of an :class:`engine.config.Settings` (an empty folder keeps the install location)."""
        return cls(twemoji_dir=settings.twemoji_dir.strip(),
                   fashion_mnist_dir=settings.fashion_mnist_dir.strip() or FASHION_MNIST_DIR,
                   tuxpaint_stamps=settings.tuxpaint_stamps.strip() or TUXPAINT_STAMPS,
                   gcompris_rcc=settings.gcompris_rcc.strip() or GCOMPRIS_RCC, progress=bool(settings.progress))


_configured = DataSources()


def configure(settings) -> DataSources:
    """Called once by an entry point (the CLIs, each command's ``main``) with the Settings it built, through
    ``engine.process.configure_process`` (which sizes the decode budget too)."""
    global _configured
    _configured = DataSources.from_settings(settings)
    return _configured


def configured() -> DataSources:
    """The sources the entry point configured (the install locations when none did)."""
    return _configured
