# clustr_mm's part of every config's runtime (the libraries' own
# default_runtime pieces give the rest): register the models, continue the
# random streams on resume, stop a run that diverges or cannot learn before
# it saves (clustr_mm/engine).
custom_imports = dict(imports=['clustr_mm'], allow_failed_imports=False)
custom_hooks = [dict(type='RandomStateHook'), dict(type='FailFastHook')]
