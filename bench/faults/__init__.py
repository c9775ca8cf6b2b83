"""``nearshore bench faults``: a misbehaving provider, case by case, through our edge and LiteLLM."""
