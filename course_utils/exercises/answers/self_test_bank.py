"""The self-test's feedback (lesson 11): for each lesson, where to look, and for each cause it can name, what
you would see if it were that cause — the sentence a learner reads after picking it wrongly. It says why
the *chosen* option does not fit and points to the section, never which option does.

One entry per lesson; a new lesson (12, 13, …) adds its own: ``SECTIONS["12"]`` and ``TELLS["12"]`` keyed by
the causes its ``answers/lessonNN.py`` names in ``SELF_TEST_CAUSES`` (and draws with ``self_test_case``).
``tests/test_exercises_self_test.py`` fails when a contributing lesson's cause has no tell here.
"""

SECTIONS = {
    "01": "lesson 01 §3 (the split test) and §4 (cause)",
    "02": "lesson 02 §3 (diagnose: the replies, generate's stop list) and §5c/5d (graded span, pad == eos)",
    "03": "lesson 03 §3 (diagnose: which tokens each query sees) and §4 (cause)",
    "04": "lesson 04 §3 (diagnose: the tokens whose loss_mask is 1)",
    "05": "lesson 05 §3 (diagnose: graded tokens per step) and §4 (cause)",
    "06": "lesson 06 §3 (diagnose: the first non-finite step and module)",
    "07": "lesson 07 §3 (diagnose: the weight of one token in each row)",
    "09": "lesson 09 §3 (diagnose: what the data holds against what is rendered and graded)",
    "10": "lesson 10 §3 (diagnose: what the user's generate() stops on and which template it renders)",
    "12": "lesson 12 §3 (diagnose: the positions the mask builder receives) and §5 (the same probe, other "
          "architectures)",
    "13": "lesson 13 §3 (diagnose: trainable LoRA parameters per group) and §5 (fix)",
}

TELLS = {
    "01": {
        "missing_division": "the split test's norm would grow K-fold with the accumulation steps "
                            "(grad_norm(K) ≈ K × grad_norm(1)); check whether it does here",
        "clip_far_below_norm": "the logged grad_norm would sit above max_grad_norm from the first step, with "
                               "a split test that stays flat",
        "lr_too_high": "the loss would fall, reach a minimum and then climb, with the gradient norm growing "
                       "as it turns",
        "healthy": "the loss would fall steadily, the norm stay near or under max_grad_norm and the split "
                   "test stay flat",
    },
    "02": {
        "wrong_stop_ids": "the replies would write the stop token and then go on writing after it",
        "stop_token_not_graded": "the replies would never write the stop token, while the pad token is "
                                 "another token than the stop token",
        "pad_equals_eos": "the pad token would be the stop token itself, and the rows' graded tokens would "
                          "never include it",
        "max_new_tokens_too_small": "the replies would stop inside their answer, at exactly max_new_tokens "
                                    "tokens",
    },
    "03": {
        "left_padding_without_mask": "the batch would be left-padded and called with no attention_mask",
        "packing_without_position_reset": "several examples would share a row with position_ids that never "
                                          "go back to 0",
        "packing_with_all_ones_mask": "several examples would share a row whose attention_mask is all ones "
                                      "and whose positions do not restart",
        "packing_with_cache": "a packed row would be called with use_cache on and no mask",
        "right_padded_generation": "generate() would be called on prompts padded on the right",
        "never_stops": "the examples would be separated correctly, but the generations would run to the "
                       "length limit",
        "no_leak": "every query would see only its own example's tokens",
    },
    "04": {
        "whole_sequence_graded": "the system and user tokens would carry loss too",
        "markers_mark_nothing": "no token at all would carry loss",
        "stop_token_not_graded": "the answers' words would carry loss but <|im_end|> after them would not",
        "trains_correctly": "exactly the assistant answers and their <|im_end|> would carry loss",
    },
    "05": {
        "empty_micro_batch": "one step would hold no graded token (every answer truncated away), its loss "
                             "0/0, and the run would recover after it",
        "nan_weights": "after the step with no graded token every later loss would stay NaN: the weights "
                       "themselves went NaN",
        "healthy": "every step would hold graded tokens and every loss would be finite",
    },
    "06": {
        "all_masked_labels": "a batch with no target would come first, and every loss after it would be NaN",
        "fp16_overflow": "an activation in float16 would pass 65504 (inf) before any loss went NaN",
        "learning_rate_too_high": "the loss and the gradient norm would grow for several steps before the "
                                  "first non-finite value",
        "empty_batch_zero_grad": "a batch with no target would show a zero gradient and the run would go on "
                                 "with finite losses",
        "healthy": "every loss and every gradient norm would stay finite",
    },
    "07": {
        "per_micro_batch_mean": "one token's weight would depend on how many tokens its micro-batch holds",
        "per_rank_mean": "one token's weight would depend on how many tokens its process holds",
        "missing_division_by_k": "every weight would be K times too large, whatever the token counts",
        "empty_micro_batch": "a micro-batch with no supervised token would give 0/0",
        "token_weighted": "every token of the step would weigh the same",
    },
    "09": {
        "healthy": "every reasoning block and tool call the data holds would be rendered and graded as "
                   "intended",
        "reasoning_dropped": "a turn's reasoning_content would be missing from the rendering's graded "
                             "think blocks",
        "empty_think_graded": "an empty <think></think> would sit inside the graded span",
        "tool_reply_graded": "tokens inside <tool_response> would carry loss",
        "tool_calls_dropped": "the data's tool calls would be missing from the rendering",
        "arguments_as_string": "the arguments would render as an escaped JSON string "
                               "(\"arguments\": \"{\\\"…)",
    },
    "10": {
        "healthy": "the served stop tokens, template and token rows would all be the trained ones",
        "eos_not_shipped": "the end-of-turn id would be missing from what the served generate() stops on",
        "template_not_shipped": "the template the user's prompt is rendered with would differ from the "
                                "trained one",
        "token_rows_not_shipped": "the run would have trained embed_tokens/lm_head and the adapter would not "
                                  "save them",
    },
    "12": {
        "mask_without_positions": "B's logits would move when packed, and the causal-mask builder would "
                                  "receive no position_ids (None)",
        "mixer_ignores_boundaries": "B's logits would move although the mask builder receives positions that "
                                    "restart at 0: something outside attention mixes the samples",
        "kernel_refuses_metadata": "the packed forward would raise, naming a kernel it needs to keep packed "
                                   "sequences apart",
        "healthy": "B packed would match B alone to round-off (max |Δlogit| ~1e-6)",
    },
    "13": {
        "fused_experts_unreached": "the routed_experts row would show 0 adapted while the targets name the "
                                   "MLP projections",
        "mixer_unreached": "the linear_mixer row would show 0 adapted while attention is adapted",
        "dropout_with_target_parameters": "SFTTrainer would raise about lora_dropout before any table exists",
        "healthy": "every group the targets aim at would show adapters (the router may stay frozen)",
    },
}
