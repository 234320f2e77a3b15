"""Accelerate configs: preset or file + options -> one typed ResolvedConfig -> one rule set -> YAML (+ DeepSpeed JSON).

    choices.py   Backend and the other closed sets of values (a leaf: the CLI reads its choices here)
    options.py   ConfigOptions: what the user asked for, one table of flags, help, choices and config keys
    reader.py    a config file's dict -> the values it sets, with what only a file can get wrong
    resolve.py   options on top of a preset or file, defaults filled -> ResolvedConfig (+ Accelerate's own check)
    resolved.py  ResolvedConfig: typed, frozen, the source of every value; to_accelerate_dict()
    rules.py     the one rule set over a ResolvedConfig (config, launch and `config --check` share its words)
    files.py     config files: load (line and column of syntax errors), check (`accelkit config --check`), and
                 read the comment lines accelkit writes into them
    render.py    a config -> commented YAML (+ its DeepSpeed JSON), written without partial files
    model_heads.py  the model's attention heads and layers (config.json) against the tp size and the pp stages
    pipeline_spec.py  PipelineSpec: where a pipeline layout lives (no Accelerate key): $ACCELKIT_PIPELINE and
                 the YAML's comment line
    mesh.py      Mesh: the one N-D mesh type (pp included, one dimension order) and its `dim=size,...` parser
    api.py       run_config: `accelkit config` as one call (write or print the YAML, --list, --check)
    presets.py, machine_defaults.py, deepspeed_json.py, schema.py   the presets, defaults from this machine, the
                 DeepSpeed JSON, and the keys Accelerate accepts (read from Accelerate itself)

Importing this package is cheap: its names load on first use, and accelerate, torch and yaml are imported inside
the functions that need them.
"""

from __future__ import annotations

from accelkit.exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    # what the user asks for, and the closed sets of values
    "ConfigOptions": "options",
    "OPTION_FLAGS": "options",
    "Backend": "choices",
    "MixedPrecision": "choices",
    "OffloadDevice": "choices",
    "from_accelerate": "choices",
    # options or a file -> the typed config, and where each value came from
    "resolve_config": "resolve",
    "as_bool": "reader",
    "ResolvedConfig": "resolved",
    "FsdpSettings": "resolved",
    "DeepSpeedSettings": "resolved",
    "Source": "resolved",
    # the rule set and what it finds
    "refuse_rule_errors": "rules",
    "installed_layout_gaps": "compat",
    "model_from_script_args": "model_heads",
    # the pipeline layout, which Accelerate has no key for
    "Mesh": "mesh",  # the one N-D mesh type: bench's --layouts and plan's rows wrap it
    "pipeline_with_config_comment": "pipeline_spec",
    # files: load, check, write
    "load_accelerate_config": "files",
    "comment_spec": "comment_lines",
    "write_config": "render",
    "write_deepspeed_json": "render",
    # the command as one call
    "run_config": "api",
})
