"""`convert piper --onnx` refuses an ONNX exported for a SoC whose time field is wider than the target's."""
import pytest

from converters.families.piper import _check_exported_for
from core.errors import SetupError


def test_rk3588_export_is_refused_for_rk3576_with_the_reexport_command(joe_exports):
    onnx_path = joe_exports[False].onnx
    _check_exported_for(onnx_path, "rk3588")  # the SoC it was exported for: accepted
    with pytest.raises(SetupError, match=r"re-export for this target: convert piper --window 109 --context 32 "
                                         r"--target rk3576"):
        _check_exported_for(onnx_path, "rk3576")
