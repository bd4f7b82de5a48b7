"""Vision-language backbones behind one interface (see base.Backbone) and a factory."""
from .base import Backbone, TextEncoding  # noqa: F401
from .factory import BACKBONES, create_backbone  # noqa: F401
