"""Helpers shared by the test modules (importable as `helpers.<module>`: tests/ is on sys.path,
where conftest.py lives): what a run wrote (run_records), runs written without training
(our_runs), randomised HuggingFace references (hf_reference) and fine-tuned workdirs
(hf_finetuned), threefry's two CPU lowerings (threefry_rules), parameter trees by leaf path (trees)."""
