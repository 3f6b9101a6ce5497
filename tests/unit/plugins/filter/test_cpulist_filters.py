"""The cpulist filters through a real Jinja templar, as a playbook uses them."""

from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.filter.cpulist import FilterModule

FILTERS = FilterModule().filters()


@pytest.mark.parametrize(
    "name, args, result",
    [
        ("cpulist_expand", ("0-3,8",), [0, 1, 2, 3, 8]),
        ("cpulist_compress", ([3, 0, 1, 2, 8],), "0-3,8"),
        ("cpulist_compress", ("8,0-3\n",), "0-3,8"),
        ("cpulist_difference", ("0-15", "12-15"), "0-11"),
        ("cpulist_union", ("0-3", [8, 9]), "0-3,8-9"),
        ("cpulist_intersect", ("0-7", "4-11"), "4-7"),
        ("cpulist_to_mask", ("0-7,32", 40), "01,000000ff"),
        ("cpumask_to_cpulist", ("01,000000ff",), "0-7,32"),
        ("cpumask_to_cpulist", ("ff", 8), "0-7"),
    ],
)
def test_filters(name, args, result):
    assert FILTERS[name](*args) == result


@pytest.mark.parametrize(
    "name, args, fragment",
    [
        ("cpulist_expand", ("3-1",), "reversed range"),
        ("cpulist_compress", ("a,b",), "cannot parse"),
        ("cpulist_to_mask", ("0-8", 8), "does not fit"),
        ("cpumask_to_cpulist", ("1ff", 8), "wider than"),
    ],
)
def test_filters_raise_ansible_errors_naming_the_filter(name, args, fragment):
    with pytest.raises(AnsibleFilterError) as info:
        FILTERS[name](*args)
    assert fragment in str(info.value)
    assert name in str(info.value)


def test_filters_run_in_a_playbook_template(tmp_path):
    """The filters resolve by FQCN in a real ansible run against localhost."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False")
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    proc = subprocess.run(
        [ansible, "localhost", "-m", "ansible.builtin.debug", "-a",
         "msg={{ '0-175' | gpunode.tuning.cpulist_difference('160-170') }}|{{ '0-7,32' | gpunode.tuning.cpulist_to_mask(40) }}"],
        env=env, capture_output=True, text=True, check=False, cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0-159,171-175|01,000000ff" in proc.stdout
