"""SGLang 0.5.23 adapter of the DDTree overlay (an SGLang plugin).

Entry point: ``sglang_overlay.adapter.plugin:load_plugin`` (group ``sglang.srt.plugins``).
Importing this package imports neither torch nor sglang; see docs/adapter.md.
"""
