"""The engine contract is read only through its model: no string-key read of a contract outside
rkaudio/board/contract.py and rkaudio/core/contract.py, and the checker finds each form such a read takes."""
from __future__ import annotations

import textwrap

from rkaudio.core.paths import REPO_ROOT
from tests.structure.contract_reads import contract_reads, reads_in


def test_the_package_reads_contracts_only_through_the_model():
    found = contract_reads(REPO_ROOT)
    assert not found, ("contract fields read by key (read them through EngineContract or the family's "
                       "ContractFields):\n" + "\n".join(map(str, found)))


def test_the_checker_finds_every_form_of_a_key_read():
    planted = textwrap.dedent('''
        SET_KEY = "shape_set"
        def runtime(engine, manifest, model, contracts):
            a = engine.contract["window"]
            b = get_contract(model).get("hop")
            c = manifest["contract"]["role"]
            view = engine.contract
            d = view["context"]
            e = [x["ladder_key"] for x in contracts]
            f = "exec_params" in engine.contract
            g = main_contract.pop("reference_onnx")
            h = engine.contract[SET_KEY]
            i = engine.contract.fields["mel_bins"]
            return manifest["inputs"], engine.contract.window, contracts[0]
    ''')
    assert [(r.line, r.key) for r in reads_in(planted, "planted.py")] == [
        (4, "window"), (5, "hop"), (6, "role"), (8, "context"), (9, "ladder_key"), (10, "exec_params"),
        (11, "reference_onnx"), (12, "shape_set"), (13, "mel_bins")]
