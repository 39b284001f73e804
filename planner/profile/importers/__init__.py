"""Importers: other planners' real per-layer profiles read into a hetplan ModelProfile.

    from hetplan.profile.importers import IMPORTERS, import_pipedream
    profile = import_pipedream("vgg16.graph.txt")                 # PipeDream graph.txt
    profile = IMPORTERS["sailor"]("profiles.json", model="OPT-350")  # Sailor profiles.json
    profile = IMPORTERS["piper"]("bert32a100.json")                # Piper input JSON
    profile.save("out.profile.yaml")

Every importer raises only :class:`hetplan.errors.HetplanError` for bad input, naming the file and
the line or field. docs/importers.md says what each source field is taken to mean.
"""

from __future__ import annotations

from collections.abc import Callable

from hetplan.contracts.model_profile import ModelProfile
from hetplan.profile.importers.pipedream import import_pipedream
from hetplan.profile.importers.piper import import_piper
from hetplan.profile.importers.sailor import import_sailor

__all__ = ["IMPORTERS", "import_pipedream", "import_piper", "import_sailor"]

IMPORTERS: dict[str, Callable[..., ModelProfile]] = {
    "pipedream": import_pipedream,
    "sailor": import_sailor,
    "piper": import_piper,
}
