"""The one engine build (`rkaudio.engine.build.build_engine`), its accuracy analysis, diagnose, and the kit's
goldens written at build time."""
