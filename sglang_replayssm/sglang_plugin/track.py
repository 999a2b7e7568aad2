"""``--mamba-radix-cache-strategy extra_buffer`` with the ReplaySSM pool: the radix cache's track slots.

With ``extra_buffer`` SGLang gives every running request ping-pong *track slots* (ordinary slots of the
same mamba pool) and, whenever the request's length reaches a track boundary (``seq_len %
mamba_track_grid == 0``), copies the live state into one of them; at ``cache_unfinished_req`` /
``cache_finished_req`` the slot holding the last tracked state is donated to the radix tree at that
length, and a later request that matches the node copies it out (``copy_from``). SGLang's copies
(``track_mamba_states_if_needed`` / ``_all_layers`` at decode, ``_track_mamba_state_extend`` at
prefill) move ``temporal`` and conv only; with ReplaySSM ``temporal`` is the checkpoint and the live
state is checkpoint + committed records, so a plain copy would store a state that misses the ring.
The hooks here keep what the tree stores exact:

* decode: the metadata hook (``backends.note_step``) notes the track (rows, mask, destinations: SGLang's device
  tensors; in a CUDA-graph replay, whose metadata view of the batch has no mask, the rows and destinations wait
  for the real batch's mask, which the ``ModelRunner.forward`` hook hands to ``settle_all``), and
  ``ReplayMambaPool.settle`` does it once the step's cursor move is applied: the destination gets the source's
  whole slot (checkpoint, read copy, record ring, cursor, SR counter) and its conv state. The live slot is not
  touched (no fold), the copy is masked on the device (no host sync), and a copied ring resumes exactly. SGLang's own copy
  (``MambaAttnBackendBase._track_mamba_state_decode``; for Mamba-2, which calls the module function
  itself, ``hybrid_linear_attn_backend.track_mamba_states_if_needed``) is replaced by a note of the same
  rows (the first note of a step stands; a mixed Mamba-2 batch's decode rows are noted there).
* prefill (``MambaAttnBackendBase._track_mamba_state_extend``): SGLang writes the tracked state (an
  interior chunk state ``h`` or the final state) into the destination's checkpoint, with the prefill
  rows' rings already empty (the metadata hook folds them first); the hook then marks the destinations'
  rings empty and refreshes their read copy (``ReplayMambaPool.after_prefill``).

* speculative decoding: SGLang tracks nothing inside the verify forward; the verify commit writes the track
  slots of rows whose accepted tokens cross a boundary (``spec.py``).

Track slots are full ReplaySSM slots (ring included: "sized for the ring"); SGLang allocates them from
the same pool, so the budget hook prices them at the ReplaySSM slot price like every other slot.
"""

from __future__ import annotations

from .pool import lookup_layer


def track_mamba_state_decode(original, self, forward_batch, conv_states, ssm_states, cache_indices, layer_id=None):
    hit = lookup_layer(ssm_states)
    if hit is None:
        return original(self, forward_batch, conv_states, ssm_states, cache_indices, layer_id)
    if forward_batch.mamba_track_mask is None:
        return None
    hit[0].note_track(cache_indices, forward_batch.mamba_track_mask, self.forward_metadata.mamba_track_indices,
                      forward_batch.batch_size)
    return None


def track_mamba_states_if_needed(original, conv_states, ssm_states, cache_indices, mamba_track_mask,
                                 mamba_track_indices, batch_size, *args, **kwargs):
    hit = lookup_layer(ssm_states)
    if hit is None:
        return original(conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices, batch_size,
                        *args, **kwargs)
    hit[0].note_track(cache_indices, mamba_track_mask, mamba_track_indices, batch_size)
    return None


def track_mamba_state_extend(original, self, forward_batch, h, ssm_states, forward_metadata, *args, **kwargs):
    out = original(self, forward_batch, h, ssm_states, forward_metadata, *args, **kwargs)
    hit = lookup_layer(ssm_states)
    if hit is None or not forward_metadata.has_mamba_track_mask:
        return out
    pool, layer = hit
    for dst in (forward_metadata.track_ssm_h_dst, forward_metadata.track_ssm_recompute_dst,
                forward_metadata.track_ssm_final_dst):
        if dst is not None and dst.numel():
            pool.after_prefill(layer, dst)
    return out
