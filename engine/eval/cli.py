"""`python -m engine eval offline|generalise|triplets|concepts|fashioniq|cirr|circo ...`."""
from __future__ import annotations

import sys

from ..config import Settings
from ..process import configure_process


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m engine eval {offline,generalise,triplets,concepts,fashioniq,cirr,circo} [options]  (--help after the name)")
        return 0 if argv else 2
    if argv[0] == "offline":
        from .offline import main as offline_main

        return offline_main(argv[1:])
    if argv[0] == "generalise":
        from .generalise import main as generalise_main

        return generalise_main(argv[1:])
    if argv[0] == "concepts":
        from .concepts import main as concepts_main

        return concepts_main(argv[1:])
    if argv[0] == "triplets":
        from .triplets import main as triplets_main

        return triplets_main(argv[1:])
    from ..backbones import create_backbone
    from .official import main as official_main

    s = Settings()
    configure_process(s)
    return official_main(argv, backbone=lambda: create_backbone(s.backbone, s.device, settings=s))
