"""Exporters and the engine build. Imports nothing: the converter-venv child imports
`converters.build_engine` alone and must not pull torch-era packages in with the package."""
