"""`convert piper --onnx` refuses an ONNX exported for a SoC whose time field is wider than the target's."""
import pytest

from rkaudio.pipeline.declaration import Job
from rkaudio.families.piper import FAMILY
from rkaudio.core.errors import SetupError

pytestmark = pytest.mark.slow  # the joe voice's export


def _decoder_job(target: str, tmp_path) -> Job:
    component = FAMILY.component("decoder")
    return Job(FAMILY, component, FAMILY.source(), component.options(), FAMILY.gates_model(component)(), target,
               tmp_path)


def test_rk3588_export_is_refused_for_rk3576_with_the_reexport_command(joe_exports, tmp_path):
    onnx_path = joe_exports[False].onnx
    [record] = FAMILY.from_onnx(_decoder_job("rk3588", tmp_path), onnx_path)  # the SoC it was exported for
    assert record.onnx == onnx_path
    with pytest.raises(SetupError, match=r"re-export for this target: convert piper --window 109 --context 32 "
                                         r"--target rk3576"):
        FAMILY.from_onnx(_decoder_job("rk3576", tmp_path), onnx_path)
