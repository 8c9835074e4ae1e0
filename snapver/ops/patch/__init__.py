"""Patches: named changes on top of a base snapshot, kept as commits in the store.

``model`` the values and the patch record, ``diffs`` unified diffs in and out,
``checkout`` the editable folder (`patch new`/`save`), ``rebase``, ``capture``.
"""

from snapver.ops.patch.capture import capture_patch
from snapver.ops.patch.checkout import Checkout, SaveResult, checkout_folder, new_patch, save_patch, unsaved_edits
from snapver.ops.patch.diffs import export_patch, import_patch
from snapver.ops.patch.model import (
    Patch,
    PatchFile,
    delete_patch,
    history,
    list_patches,
    load_patch,
    unseen_versions,
)
from snapver.ops.patch.rebase import RebasedFile, RebaseResult, rebase_patch

__all__ = [
    "Checkout", "Patch", "PatchFile", "RebaseResult", "RebasedFile", "SaveResult",
    "capture_patch", "checkout_folder", "delete_patch", "export_patch", "history", "import_patch",
    "list_patches", "load_patch", "new_patch", "rebase_patch", "save_patch", "unsaved_edits", "unseen_versions",
]
