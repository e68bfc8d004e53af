"""ZeRO-3's transients, composed from the unsharded stage's and the layers' gathered bytes (no run).

[Note: the sharded backward's floor] Like the forward, a ZeRO-3 backward that follows a forward runs the data
stage's backward with the layer all-gathered and (FSDP2's backward prefetch) the layer before it too, and the
scenario's own backward transients scale and compose badly for the same reason (gpt-tiny layers 0-3, 2 replicas,
8 samples per replica: composed 413,824 bytes for the first backward, 629,504 measured). Measured on gpt-tiny's
blocks: the data stage's transient plus the block's gathered bytes and the prefetched block's, 229,632 + 2 x
199,936 = 629,504, to the byte; on wresnet-tiny's layers 4-6 the rule gives 1,027,264 below the 1,347,068
measured (there its gradient's reduce-scatter sets the peak, which the data stage does not do), so it is a
floor under the scenario's value, not a replacement (:func:`sharded_backward_floor`). Under a first backward the
data stage's suffix ``j..`` also holds the whole gradients of its layers after ``j``, which it keeps, where ZeRO-3
has reduce-scattered them into shards by the time it reaches ``j``: those suffixes are taken down by the layers'
bytes less the rank's shards before the rule (``_floored_backwards`` in predict/zero_stage.py). Without that the
floor grew with the span: gpt-tiny's ten layers as data4-zero3 at 2 samples per replica, floored to 923,904
bytes where the first backward measures 609,728 (its peak set there once ZeRO-3 over 8 ranks shrinks the
shards: the stage predicted 6.6% high); with it the floor is 491,904, under the scenario's composed 844,288.

[Note: a backward after a backward] A ZeRO-3 backward that follows a forward finds the layer before the one it
is running already all-gathered (FSDP2 prefetches in the order the forward recorded, which a backward resets):
one that follows a backward has not gathered it yet at that moment. A profile taken under 1F1B (the default)
measures the first kind in its later backwards (the steady state's, its largest; a simulated profile runs a ZeRO-3
stage with a stage after it so that it does: [Note: a ZeRO-3 stage's steady backward] in profiling/execution.py), a
GPipe plan runs only the second kind after its first backward. So under GPipe (and in ZeRO-2's backwards that find
the layers resharded, which always follow a backward) the later backward's transient is the profile's less the
gathered bytes of the layer before the one that sets it (:func:`prefetched_bytes`), found from the suffixes'
backwards after a backward where the profile ran those too (after a forward, the prefetched layer can lift an
earlier suffix above the layer that sets it: Llama-2-7B's blocks [3, 5) as data x2 hold 1,327,529,984 bytes after a
forward, one block alone and the pair after a backward 922,763,264). Measured: wresnet-tiny layers 4-6, 2 replicas,
micro-batches of 8 per replica, 1,347,068 bytes after a forward, 1,200,872 after a backward; the rule gives
1,341,928 - 150,272 = 1,191,656 (layer 5 sets it; layer 4's 150,272 bytes). An approximation: gpt-tiny's blocks
measure 629,504 against 432,640 (a block is 199,936 bytes: the rule gives 429,568) at 8 per replica, 547,584
against 416,256 at 4 (the rule: 347,648). It cannot undo what the scenario's composition added: a span
composed from a larger measured one (wresnet-tiny's layers 5-6 from 4-6 and 4-5) keeps the prefetch of a layer
it does not have.

[Note: the sharded forward from the data stage] A ZeRO-3 forward runs the data stage's forward with each layer
all-gathered just before it and freed just after; measured (gpt-tiny's blocks and wresnet-tiny's largest
bottleneck, 2 replicas, micro-batches of 8 per replica), its transient is the data stage's at the layer that sets
it plus exactly twice that layer's gathered bytes (the gathered copy and the all-gather's buffer): gpt-tiny
layers 0-3, 1,650,688 + 2 x 199,936 = 2,050,560 measured; layers 1-6, 3,235,840 + 399,872 = 3,635,712 measured;
wresnet-tiny layers 5-6, 91,136 + 2 x 595,456 = 1,282,048 measured. The scenario's own statistic is a maximum
of a part that does not grow with the batch (the all-gathers) and one that does (the compute), whose place can
move between the profiled batches and the target, so its straight-line batch scaling and its M_a composition
miss (composed 1,931,264 and 3,397,120 where the rule gives the measured values). The data scenario's prefixes scale
and compose well (data devices within 0.4% in benchmarks/zero_accuracy), so :func:`sharded_forward_transient`
takes each layer's value from them; at the model's last layer, whose loss runs after FSDP has resharded it, see
[Note: the loss runs outside every FSDP unit].

[Note: the loss runs outside every FSDP unit] The stage holding the model's last layer also computes the loss,
and that runs outside every FSDP unit: FSDP2 reshards the last layer (the head) after its forward, before the loss
runs, and its pre-backward hook all-gathers the head only once the loss's backward has produced the head's output
gradient. So in the loss's forward and backward a ZeRO-3 device holds exactly what a data device holds, no gathered
bytes; the gathered copy and the all-gather's buffer (forward) and the gathered head with the layer before it
prefetched (backward) coincide only with the head's own compute. The data stage's transient at the last layer is
the larger of the two phases, often the loss's (log-softmax of the logits; its backward twice the logits), so the
rules above, adding the gathered bytes to it, over-count. Measured on gpt-tiny (simulated devices, layer 9 = final
norm + head, 2 replicas, micro-batches of 8 per replica, 1F1B, traced op by op): forward: the head's matmul holds
32,768 (received) + 66,560 (2 x 33,280 gathered) + 33,792 (norm) + 65,536 (logits) = 198,656, the log-softmax
after the reshard 197,644, the data stage's 197,644 too: ZeRO-3 measures 198,656, where the forward rule gives
197,644 + 66,560 = 264,204; backward: the loss's 131,072 (as the data stage's), the head's 65,536 + 33,280 = 98,816:
ZeRO-3 measures 131,072, the floor gave 114,688 (the data stage's, scaled) + 33,280 = 147,968; the stage's device
was +5.06% (1F1B) and +2.37% (GPipe) over the measured peak (benchmarks/extended_accuracy).

Both scenarios measured the last layer alone at two batch sizes: ``D = max(M, S)`` (data) and ``Z = max(M + g, S)``
(ZeRO-3), with ``M`` the head's phase, ``S`` the loss's and ``g`` what FSDP adds to the head's (forward ``2G``,
backward ``G``; G its gathered bytes). Where ``Z > D`` the head set ZeRO-3's value (``M = Z - g``); where
``Z - D < g`` the loss set the data stage's (``S = D``). Each phase is linear in the batch (a straight line where
both profiled sizes show it; the loss, whose bytes are the logits', through the origin where one does; the head's,
which holds parameter-sized gradients too, kept at its value where one does, a floor), so :func:`loss_phases`
gives both at the target and the predictor uses them at the last layer: the forward adds ``max(M + 2G, S) -
max(M, S)`` to the data stage's value there instead of ``2G``; the backward's floor there is ``max(S, M + G + the
prefetched layer)``. On gpt-tiny's layer 9 both come out to the byte (198,656 and 131,072: the loss's backward
is proportional to the logits, which a straight line through the data scenario's two sizes, one set by the head
and one by the loss, misses: 114,688).

The loss also hid the layers before the head from the floor: the floor adds a layer's gathered and prefetched bytes
where the data stage's suffix rises, and a suffix that holds the loss is at least the loss's phase, which ZeRO-3
holds with nothing gathered. So before the last layer a suffix counts as rising above the head's phase, not above
the loss's (where neither profiled size showed the head's phase, above the last layer's suffix, as before). Measured (the same runs, traced): moe-tiny's layers 4-6 (a dense block, then the head), later backward:
the block's phase 97,664 + its 84,096 gathered bytes = 181,760 measured, the data stage's suffix 131,072 (the
loss's, which hid the block); the floor now 106,752 + 84,096 = 190,848 (the data suffix as scaled, a straight line
through one size the block set and one the loss set; the old floor added 84,096 + 16,640 to the loss's: 231,808,
the device +5.66%, now +1.03%); gpt-tiny's layers 4-10: block 8's 130,816 + 2 x 199,936 = 530,688 measured, the
floor now 97,536 + 399,872 = 497,408 (the scenario's composed 441,600 before: -1.66%, now -0.62%). Where a suffix
is the loss's own value this over-counts by the layer's gathered and prefetched bytes; the scenario's value stays
where it is higher, as for every floor.

[Note: ZeRO-3 composed from an unsharded stage] A replica of a ZeRO-3 ``data+tensor`` stage (runtime/sharding.py:
FSDP2 over the data dimension of a 2-D mesh) runs the ``t``-way tensor stage at the replica's batch with every
tensor rank's *shards* sharded again over its data group of ``d`` ranks, and no profile measures it (no scenario
shards the tensor stage). But the three fp32 rules above were found to hold as rules on the *unsharded* stage
plus the gathered bytes, and they carry over with the shards' shapes (``tensor_shards``, [Note: ZeRO-1 of a data x
tensor stage] in predict/zero_layout.py) in place of the layers': each rank stores padded dim-0 chunks of the
shards and of their reduce-scattered gradients and the AdamW state of its own chunks (``static`` and ``gradient``
exact from the shapes: :meth:`~hybridplan.predict.zero_layout.ZeroLayout.unsharded_shift`), steps its largest
chunk (two temporaries of its size), runs the forward as [Note: the sharded forward from the data stage] on the
tensor stage's prefixes with the shards' gathered bytes, and its backward as [Note: the sharded backward's floor] on
the tensor stage's suffixes (the floor
*is* the value here: no scenario to take a maximum with) raised to the reduce-scatter's floor below, under GPipe
less the prefetched layer ([Note: a backward after a backward]). Measured (``hybridplan run --backend sim``, 2x4, global batch 64 in 4 micro-batches, two data
x tensor 2 x 2 ZeRO-3 stages per plan, every rank of a data group; static, data, activation and gradient exact to
the byte on every one): gpt-tiny layers 0-5 / 5-10, 1F1B -0.01% / +1.24%, GPipe 0.00% / +0.34%; moe-tiny 0-3 / 3-6
1F1B -0.38% / +1.90%; wresnet-tiny 0-4 / 4-7 1F1B -0.19% / -4.59%, GPipe 0.00% / -0.23%. The forward is exact on
gpt-tiny (1,389,696 unsharded + 2 x 100,736, a block's shards gathered, = 1,591,168 measured), as are its blocks'
backward (131,328 + 2 x 100,736 = 332,800). What missed: at the model's last layer the loss runs outside every
FSDP unit ([Note: the loss runs outside every FSDP unit]) and its phase hides the head's and the earlier layers',
so the floor added the head's and the prefetched block's gathered bytes to the loss's phase (gpt-tiny layers 5-10
later backward 248,704 predicted, 217,600 measured: +1.24% on the device; composed since 28 Nov by [Note: the
layers before the head]); and where a layer's reduce-scatter sets the backward (wresnet-tiny's layer 5, whose 298,240
gathered bytes are held with its unsharded gradient of the same size and layer 4 prefetched: 685,272 measured
against the floor's 512,064), the floor misses it, as it does for a data stage; there a scenario measured it. Here
:func:`reduce_scatter_floor` takes it from the tensor stage's first-backward suffix, which holds layer ``j``'s
whole gradients and the later layers' (ZeRO-3: their shards), plus the reduce-scatter's input and the prefetched
layer: 310,612 - 6,168 + 3,084 + 298,240 + 75,392 = 681,160 (-0.6%); on gpt-tiny's blocks it gives the floor's
value (332,800) at the stage's last block and less before it. Over benchmarks/extended_accuracy's 18 plans drawn
with a ZeRO-3 data x tensor stage (72 devices of such stages) it took them from 72.2% to 94.4% within 2%, largest
10.41% both times: wresnet-tiny's layers 4-5 under GPipe, whose first backward measures 903,296 bytes against its
later ones' 620,416 (predicted to the byte); [Note: a first backward after several forwards] composes it. A
ZeRO-3 data x tensor stage holding the model's last layer is [Note: the layers before the head]; a recomputed one
[Note: a recomputed ZeRO-3 stage].

[Note: a recomputed ZeRO-3 stage] Under recompute (runtime/stage.py: each layer checkpointed around its FSDP unit)
a ZeRO-3 backward gathers each layer again in its pre-backward hook, recomputes the layer's forward and runs its
backward; a recomputed layer's phase is its own (the later layers hold only their checkpointed inputs), so the
unsharded stage's suffixes tie where its layers are alike (gpt-tiny's blocks: 429,056 bytes each) and
:func:`sharded_backward_floor`, which adds gathered bytes only where a suffix rises, misses the earlier layers,
where a rank holds most. Composed so, they were low (gpt-tiny's layers 0-2 as data 2 x tensor 2, ZeRO-3, fp32,
GPipe: 1,250,568 bytes predicted, 1,300,936 measured; ZeRO-2 to -8.13%, wresnet-tiny's layers 2-4 in bf16), and
recomputed ZeRO-2/3 data x tensor stages were refused until 28 Nov. Traced op by op (simulated devices, data 2 x
tensor 2, global batch 64 in 4 micro-batches), at layer ``k`` a rank holds: the layer's phase, its gathered bytes,
the reduce-scatter input of the layer after it (FSDP2's ``comm_ctx.reduce_scatter_states`` keeps one input, by
default, until the next layer's post-backward or the backward's end),
the prefetched layer before it where the backward follows a forward, and in a first backward the later layers'
gradient shards. The phase is the unsharded recomputed stage's first-backward suffix from ``k`` less the later
layers' whole gradients, where layer ``k`` sets that suffix (it is larger than the next one's; otherwise the
suffix is a later layer's phase and ``k``'s own is not known: the MLP's layer 0, whose suffix is its ReLU's and
head's, 33% high so); a later backward is at least the unsharded stage's later suffix too, and at least that
phase, since every ZeRO-3 backward allocates its layer's gradients afresh as a first one does (moe-tiny's MoE block
measured 65,536 bytes above the unsharded later suffix). A first backward after several forwards holds, at the
span's first layer, the previous micro-batch's last layer gathered again ([Note: a first backward after several
forwards]), once here. :func:`recomputed_backwards` gives each layer's moment; the stage's transients are the
largest, and at least the floors above. gpt-tiny's layers 1-4 in bf16 under 1F1B: the first backward 484,608 bytes
at layer 1 = 333,504 (the suffix; no later layer's whole gradients left in it, they are in the level) + 3 x 50,368
(its gathered bytes, layer 2's reduce-scatter input, block 4 gathered again), to the byte; the later one 366,272
at layer 3 = 215,040 + 3 x 50,368 (its own, layer 4's input, layer 2 prefetched), 128 bytes short.

ZeRO-2 (``reshard_after_forward=False``) recomputes on the layers it kept gathered: its backward that finds them
gathered holds at layer ``k`` the moment less the gathered bytes of layers ``k..`` (in its level, or freed), as in
[Note: predicting ZeRO-2 from the ZeRO-3 scenario] (predict/zero2_replay.py), and since it shards what ZeRO-3 shards
and keeps each layer gathered at least as long, its peak is taken to be at least ZeRO-3's (measured equal in 22 of
the 24 GPipe pairs below, where the first backward after every forward sets it; below it in 2 of the 48 pairs, the
MLP's layers 1-2, by 512 bytes). Measured (benchmarks/zero_recompute: gpt-tiny, wresnet-tiny, moe-tiny and the MLP
in fp32 and bf16, three spans each not holding the model's last layer, ZeRO-2 and ZeRO-3, both schedules; 96
stages, 384 devices): 304 exact to the byte, none low, the largest +5.44% (the MLP's layers 0-3, 1,024 bytes: the
floor on the unsharded suffix, which the stages not recomputed share).

[Note: a first backward after several forwards] FSDP2's backward prefetch (torch/distributed/fsdp/_fully_shard/
_fsdp_param_group.py ``_backward_prefetch``) gathers, in a layer's pre-backward, the layer recorded before it in
the forward order, and that order holds every forward run since the last backward. So the first backward after
two forwards or more (GPipe's first backward; 1F1B's where the stage has a stage after it), at the span's first
layer with parameters, finds "before" it the previous micro-batch's LAST layer, resharded by its own backward a
moment ago, and gathers it again (the all-gather's buffer, never copied out and held until the backward's end:
nothing runs that layer again). Traced op by op (wresnet-tiny's layers 4-5 as data 2 x tensor 2, ZeRO-3,
global batch 64 in 4 micro-batches, simulated devices): the first backward measures 903,296 bytes above its level
under GPipe and 1F1B alike, at layer 4's convolution backward, with 298,240 bytes (layer 5's gathered size) held
twice: the buffer of ``_prefetch_unshard`` of layer 5 in layer 4's ``pre_backward`` and layer 5's reduce-scatter
input, which FSDP2 frees at the next unit's post-backward (layer 4's); and layer 5's reduce-scattered gradient
(149,120), where the later backwards (one forward since the last backward, or none) measure 620,416 (GPipe) and
695,808 (1F1B), as composed. The rule (:func:`first_backward_prefetch_floor`) is :func:`reduce_scatter_floor`'s
value at the span's first layer with parameters plus the last one's gathered bytes and the next one's (its
reduce-scatter input): 380,544 (the tensor stage's first-backward suffix from layer 4) - 298,240 + 149,120 +
75,392 + 2 x 298,240 = 903,296, to the byte; the
device's peak, 1,993,248 under GPipe and 1,728,544 under 1F1B, is then predicted to the byte (it was -10.41% and
-1.20%). It applies only where that layer sets its suffix's first backward (a suffix larger than the next one's):
otherwise the suffix's value is a later layer's phase and the first layer's own is not known, and adding the
prefetch to it over-counts (the MLP's layers 0-2, Linear, ReLU, Linear, as data 2 x tensor 2: 15,856 bytes
measured, +9.28% with the rule, +3.03% (1F1B) and -0.61% (GPipe) without). Over benchmarks/extended_accuracy it
lifted the refusal of ZeRO-3 data x tensor stages under GPipe: 146 plans scored (9 more), 72 devices of such
stages, all within 2% (largest 0.69%).

[Note: the layers before the head] A ZeRO-2/3 data x tensor stage that ends the model was refused until 28 Nov:
the tensor stage's suffixes there hold the loss's phase (every one of gpt-tiny's layers 5-10 at 8 rows per
replica: 131,072 bytes, 2 x the logits), which hides the earlier layers' own phases, so the floors above added the
head's and the prefetched block's gathered bytes to the loss's phase (gpt-tiny's layers 5-10 as data 2 x tensor 2
ZeRO-3 after a pipeline-only stage, 1F1B: +4.23% on every device once composed so; the MLP's layers 3-5 -3.09%,
-5.88% under GPipe). Traced op by op (simulated devices, global batch 64 in 4 micro-batches): a rank runs the
loss (nothing gathered), then the head (its own phase, its gathered bytes, the layer before it prefetched), then
the layers before it as a stage ending there would, but above a level that no longer holds the head's activations
(freed by the head's and the loss's backwards), with the head's gradient shard (in a first backward) and, while
the layer just before the head runs, the head's reduce-scatter input (freed at that layer's post-backward). So the
span less the head is composed with the rules above on the unsharded stage's suffixes of ``[start, stop - 1)``
less the head's activation (from the stage's activation prefixes) plus those, and the head's moment is the larger
of its suffix and its own phase measured alone ([Note: the head's backward phase] in profiling/loss_memory.py)
with its and the prefetched layer's gathered bytes (``_ending_backwards`` in predict/composed_zero.py). gpt-tiny's
layers 5-10: block 8's first backward 131,328 (the suffix of 5-9) - 132,100 (the head's activation) + 2 x 100,736
(block 8 gathered, block 7 prefetched) + 8,448 (the head's shard) + 16,896 (its reduce-scatter input) = 226,044,
measured 226,048; the head's moment 32,768 (its phase at 8 rows, split 2 ways) + 16,896 + 100,736 = 150,400,
below the block's (taking the loss's phase for the head's gave 248,704: +1.24%). The MLP's layers 3-5 (a ReLU,
then the head): the later backward at the ReLU 2,048 - 324 + 792 (the head's reduce-scatter input) = 2,516,
measured 2,520 (in its layers 0-5 the input is held while layer 2 runs too, freed after its reduce-scatter:
below). Without
the head's phase recorded (a profile taken before 28 Nov) the loss's is taken for it where the loss sets the
suffix: an over-count of at most the head's and the prefetched layer's gathered bytes (moe-tiny's layers 4-6
+5.80% under 1F1B; predicted to the byte with it). ZeRO-2 there keeps the composition of [Note: predicting ZeRO-2
from the ZeRO-3 scenario] and its peak is taken to be at least ZeRO-3's (as recomputed): the MLP's layers 3-5
under GPipe were -5.88% without that, -0.05% with it, its head alone in bf16 -3.98% and +2.01% (ZeRO-2 measures
ZeRO-3's bytes there); a bound, not always met: gpt-tiny's layer 9 alone under GPipe measures 705,820 bytes as
ZeRO-2, 722,712 as ZeRO-3 (+2.39%). The head's reduce-scatter input
is held down to the next layer with parameters (FSDP2 frees it at that unit's post-backward: the MLP's ReLU and
layer 2 both hold it), and the layers before the one before the head run without the gradient the head hands back
(freed once that layer has used it), which the tensor stage's suffixes hold (a stage ending before the head holds
the gradient it receives through its whole backward): its bytes per sample are recorded with the head's phase.
Traced op by op, the MLP's layers 2-5 under GPipe, the first backward after two forwards ([Note: a first backward
after several forwards], on the span less the head, the head gathered again once beside its reduce-scatter input):
layer 2's moment 2,696 (its suffix less the head, without the 1,024-byte gradient) + 2,112 (layer 2 gathered) +
792 (the head gathered again) + 792 (its reduce-scatter input) = 6,392 bytes, 6,396 measured (it was composed
7,420 with that gradient and the head counted twice: +6.55%); the MLP's layers 0-5 -0.02% (+1.23% before).
Recomputed (predicted since 28 Nov too), the stage takes [Note: a recomputed ZeRO-3 stage]'s
transients on the recompute profile's tensor stage, and at least these: without them the MLP's layers 3-5 were
-3.09% (1F1B) and -5.88% (GPipe), the ReLU's moment again, with them -0.06% and -0.04%
(benchmarks/zero_recompute ``--ending``: 416 devices in fp32 and bf16, none more than 1.92% low, 70.2% within 2%,
the largest +7.98%, where the reduce-scatter's cast term over-counts in bf16). The head's moment there is taken
from its phase measured recomputed (the recompute profile's table: [Note: the head's backward phase]), and in the
later backward the reduce-scatter's floor leaves out the later layers' shards, which are in its level (gpt-tiny's
layers 5-10 in bf16, 1F1B: +6.00% with both as above, +3.16% now).

ZeRO-2 of a data x tensor stage is then [Note: predicting ZeRO-2 from the ZeRO-3 scenario] (predict/zero2_replay.py)
on the composed ZeRO-3 stage: the same replay and transients, each suffix's ZeRO-3 backward composed like the stage's (the floor on the
tensor stage's suffix), the gathered forward the tensor stage's. Measured the same way (data x tensor 2 x 2,
ZeRO-2): gpt-tiny layers 0-5 and 5-10 exact to the byte under both schedules, moe-tiny 0-3 / 3-6 -0.59% / 0.00%
(GPipe), wresnet-tiny 0-4 / 4-7 0.00% / -1.09% (1F1B); its peaks are set by the gathering forward and the gathered
backward, which the floor's misses above do not reach. A stage holding the model's last layer: [Note: the layers before the head].

A ZeRO-3 *data* stage wider than the profiled ZeRO-3 degrees is still refused (predict/plan_checks.py): composed
as the widest profiled ``data<d>-zero3`` stage at the global batch ``B*d/D`` with ``static`` and ``gradient`` moved to
``D`` ranks' chunks, benchmarks/extended_accuracy's four stored data x8 ZeRO-3 plans measure wresnet-tiny +1.24%
(GPipe) and -0.19% (1F1B) but gpt-tiny +6.17% and +6.61%: the whole model is a span the data4-zero3 scenario
composes by M_a (its first backward composed 844,288 bytes at 2 rows per replica, 580,576 measured at x8 and
609,728 at x4; the same stage as data x4 at the same rows is +2.29% from its own scenario, and +3.40% / +4.74% at
x8 even with the scenario's values as they stand); composed from the unsharded data stage as above, gpt-tiny is
+6.17% / +6.61% too and wresnet-tiny -0.29% / -5.11%.

[Note: the reduce-scatter in mixed precision] Under FSDP2's ``MixedPrecisionPolicy`` (runtime/sharding.py: bf16 or
fp16 parameters and reduction, fp32 shards) a layer's post-backward copies its low-precision gradients into the
reduce-scatter's input (its gathered bytes, low precision), frees them, reduce-scatters into a low-precision
output of ``1/d`` of the input, casts that to fp32 (twice its bytes; ``aten._to_copy``) and frees the output once
the cast is the shard's gradient or added to it. In fp32 the output is the shard itself: the rules above were
measured so, and they count the layer's whole gradients where the output is (at least as large). In mixed
precision the moment holds ``3 G/d`` (output and cast) where the whole gradients were ``W`` (the layer's
low-precision bytes), so :func:`reduce_scatter_floor` adds ``max(0, 3 G/d - W)`` at each layer (0 from d = 3 on:
:meth:`~hybridplan.predict.zero_layout.ZeroLayout.scatter_extra`) and ZeRO-2's bound from the unsharded stage
(:func:`~hybridplan.predict.zero2_replay.unsharded_backward_bound`) three shards. Traced op by op (the MLP in
bf16, its layers 1-2 as data 2 x tensor 2, ZeRO-2, simulated devices): the later backward's peak is at the cast,
3,696 bytes above its level: the tensor stage's 2,336, the input's 1,056, the output's 528 and the cast's 1,056,
less the freed 1,024-byte weight gradient and a 256-byte temporary; composed 9,176 bytes against 8,952 measured
(+2.50%; without the term -3.40%). The rest holds as measured in fp32 once the gathered bytes are the
low-precision copies. Measured in bf16 on simulated devices (benchmarks/zero_bf16: 4 models, 3 spans each not
holding the model's last layer, both schedules, every rank): ZeRO-2 data x tensor 2 x 2 stages to the byte on
gpt-tiny and wresnet-tiny (12 stages), -1.11% to +2.50% on moe-tiny and the MLP; ZeRO-3 data x tensor stages
never low, +0.00% to +6.90% (gpt-tiny +0.74% to +1.97%: the term is the whole error there, its blocks'
temporaries already covering the cast; the MLP's +6.90% an over-count the fp32 rules share); ZeRO-2 data stages
from the data2-zero3 scenario -3.53% to +2.01%, and ZeRO-3 data stages, which were the scenario's own
quantities in mixed precision, with these rules: gpt-tiny to the byte (they were -0.79% to -6.27%), moe-tiny
-3.06% to -0.18% (they were -9.13% to -2.00%; in fp32 -3.78% to -0.21%: what remains is the scenario's own
composition of those spans).
At paper size a ZeRO-3 data 4 x tensor 2 stage composed so measured +0.07% (MoE 1.3B), +0.25% (GPT-3 2.6B) and
exact (GPT-3 6.7B) on simulated 40 GiB CUDA devices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["sharded_forward_transient", "sharded_backward_floor", "prefetched_bytes", "reduce_scatter_floor",
           "first_backward_prefetch_floor", "loss_phases", "RecomputedBackwards", "recomputed_backwards"]


def sharded_forward_transient(prefix_forward: Sequence[float], prefix_activation: Sequence[float],
                              gathered: Sequence[int], *, keep: bool, last_added: float | None = None) -> float:
    """An FSDP forward's transient from the UNSHARDED data stage's prefixes and the gathered bytes
    ([Note: the sharded forward from the data stage]).

    ``prefix_forward[k]`` and ``prefix_activation[k]``: the data stage's forward transient and activation of the
    span's first ``k + 1`` layers; ``gathered[k]``: layer ``k``'s gathered bytes. Layer ``k`` adds twice its
    gathered bytes to what the data stage holds at it (where its prefix's transient rises, layer ``k`` sets it;
    elsewhere at least the activations before ``k``); ``keep`` (ZeRO-2's gathering forward) adds the earlier
    layers, still gathered. ``last_added``: what FSDP adds at the span's last layer instead of twice its gathered
    bytes, where that layer is the model's last and the loss runs after it, resharded ([Note: the loss runs outside
    every FSDP unit]).

    >>> sharded_forward_transient([10, 30, 25], [5, 12, 20], [4, 8, 2], keep=False)  # layer 1: 30 + 16
    46
    >>> sharded_forward_transient([10, 30, 45], [5, 12, 20], [4, 8, 20], keep=False, last_added=1)  # 45 + 1, not 85
    46
    >>> sharded_forward_transient([10, 30, 25], [5, 12, 20], [4, 8, 2], keep=True)  # layer 2: 12 + 4 + 14
    50
    """
    best, highest, before, kept = 0.0, -math.inf, 0.0, 0
    last = len(gathered) - 1
    for k, (value, activation, size) in enumerate(zip(prefix_forward, prefix_activation, gathered)):
        at = value if value > highest else before
        highest = max(highest, value)
        added = last_added if k == last and last_added is not None else 2 * size
        best = max(best, at + added + (kept if keep else 0))
        before, kept = activation, kept + size
    return best


def sharded_backward_floor(suffix_backward: Sequence[float], gathered: Sequence[int], *,
                           loss: tuple[float, float] | None = None, extra: Sequence[int] | None = None) -> float:
    """The least a ZeRO-3 backward that follows a forward holds above its level, from the UNSHARDED data stage's
    suffixes ([Note: the sharded backward's floor]): at the layer that sets the data stage's transient
    (``suffix_backward[j]``: its backward transient of the span's layers ``j..``; a backward runs them last to
    first, so a suffix's backward is the span's until it reaches layer ``j``), that transient plus the layer's
    gathered bytes and the prefetched layer's before it.

    ``loss``: the ``(head, loss)`` phases of the span's last layer when it is the model's last
    (:func:`loss_phases`); there the loss's phase holds no gathered bytes and the head's holds its own and the
    prefetched layer's, and an earlier layer rises where its suffix exceeds the head's phase, not the loss's
    (where the head's phase is known; [Note: the loss runs outside every FSDP unit]). ``extra[j]``: what layer
    ``j``'s moment holds beyond those (the head's reduce-scatter input before it: [Note: the layers before the
    head]).

    >>> sharded_backward_floor([50, 70, 40], [10, 20, 5])  # layer 2: 40 + 5 + 20; layer 1: 70 + 20 + 10
    100
    >>> sharded_backward_floor([50, 40], [10, 5], loss=(15, 40))  # layer 1: max(40, 15 + 5 + 10); layer 0: 50 + 10
    60
    >>> sharded_backward_floor([35, 40], [10, 5], loss=(15, 40))  # layer 0 rises above the head's 15: 35 + 10
    45
    """
    best, highest, last = -math.inf, -math.inf, len(suffix_backward) - 1
    for j in range(last, -1, -1):
        if suffix_backward[j] > highest:
            highest = suffix_backward[j]
            before = next((size for size in reversed(gathered[:j]) if size), 0)
            if j == last and loss is not None:
                best = max(best, loss[1], loss[0] + gathered[j] + before)
                if loss[0] > -math.inf:  # the head's phase seen: the loss hides nothing before it
                    highest = loss[0]
            else:
                best = max(best, suffix_backward[j] + gathered[j] + before + (extra[j] if extra else 0))
    return best


def prefetched_bytes(suffix_backward: Sequence[float], gathered: Sequence[int]) -> int:
    """The gathered bytes of the layer a ZeRO-3 backward that follows a forward holds prefetched at its peak, and one
    that follows a backward does not ([Note: a backward after a backward]): the span's layer before the one that
    sets the backward transient (``suffix_backward[j]``: the backward transient of the span's layers ``j..``, as in
    :func:`sharded_backward_floor`); 0 when that is the span's first layer with parameters.

    >>> prefetched_bytes([50, 70, 40], [10, 20, 5])  # layer 1 sets it; layer 0 is prefetched
    10
    """
    peak, highest = 0, -math.inf
    for j in range(len(suffix_backward) - 1, -1, -1):
        if suffix_backward[j] > highest:
            peak, highest = j, suffix_backward[j]
    return next((size for size in reversed(gathered[:peak]) if size), 0)


def reduce_scatter_floor(first_suffix: Sequence[float], gathered: Sequence[int], whole: Sequence[int],
                         shards: Sequence[int], extra: Sequence[int] | None = None) -> float:
    """The least a ZeRO-3 backward holds above its level while a layer's gradients are reduce-scattered, from the
    UNSHARDED stage's first-backward suffixes ([Note: ZeRO-3 composed from an unsharded stage]).

    ``first_suffix[j]``: the unsharded stage's first-backward transient of the span's layers ``j..``, which holds
    layer ``j``'s whole gradients and the later layers' (``whole``: each layer's parameter bytes). ZeRO-3 holds the
    later layers' reduce-scattered ``shards`` instead, and beside layer ``j``'s whole gradients the reduce-scatter's
    input (``gathered[j]``: every rank's padded chunk) and the layer before it, prefetched; ``extra[j]``: what the
    reduce-scatter holds beyond those in mixed precision ([Note: the reduce-scatter in mixed precision]).

    >>> reduce_scatter_floor([100, 80], [40, 20], [40, 20], [20, 10])  # layer 0: 100 - 20 + 10 + 40; layer 1: 80 + 20 + 40
    140
    >>> reduce_scatter_floor([100, 80], [40, 20], [40, 20], [20, 10], [20, 10])  # 130 + 20 and 140 + 10
    150
    """
    best = -math.inf
    for j in range(len(first_suffix)):
        before = next((size for size in reversed(gathered[:j]) if size), 0)
        best = max(best, first_suffix[j] - sum(whole[j + 1:]) + sum(shards[j + 1:]) + gathered[j] + before
                   + (extra[j] if extra else 0))
    return best


def first_backward_prefetch_floor(first_suffix: Sequence[float], gathered: Sequence[int], whole: Sequence[int],
                                  shards: Sequence[int], extra: Sequence[int] | None = None,
                                  again: int | None = None) -> float:
    """The least a ZeRO-3 backward that follows two forwards or more holds above its level while the span's first
    layer with parameters runs ([Note: a first backward after several forwards]): :func:`reduce_scatter_floor`'s
    value at that layer, with the span's last layer with parameters gathered again beside it (its all-gather's
    buffer and the gathered copy: twice its gathered bytes); -inf where one layer holds the span's parameters, or
    where that layer's suffix is no larger than the next one's (the suffix's value is then a later layer's phase,
    and the first layer's own is not known); beside them the next layer with parameters' reduce-scatter input
    (its gathered size). ``again``: the bytes gathered again where that layer is not in the span given (the span
    less the model's last layer: [Note: the layers before the head]); one layer with parameters is then enough.

    >>> first_backward_prefetch_floor([100, 80], [40, 20], [40, 20], [20, 10])  # 100 - 20 + 10 + 40 + 2 x 20
    170
    >>> first_backward_prefetch_floor([80, 80], [40, 20], [40, 20], [20, 10])  # layer 1's phase sets both suffixes
    -inf
    """
    layers = [j for j, size in enumerate(gathered) if size]
    if len(layers) < (2 if again is None else 1):
        return -math.inf
    j = layers[0]
    if j + 1 < len(first_suffix) and first_suffix[j] <= first_suffix[j + 1]:
        return -math.inf
    fetched = gathered[layers[-1]] if again is None else again
    scattering = gathered[layers[1]] if len(layers) >= 2 else 0  # the next layer's reduce-scatter input
    return (first_suffix[j] - sum(whole[j + 1:]) + sum(shards[j + 1:]) + gathered[j] + fetched + scattering
            + (extra[j] if extra else 0))


def loss_phases(sizes: Sequence[int], data: Sequence[float], zero3: Sequence[float], added: float,
                size: int) -> tuple[float, float]:
    """The model's last layer's two phases at micro-batch ``size``: ``(head, loss)``, the bytes above the level
    while its own module runs and while the loss runs ([Note: the loss runs outside every FSDP unit]); ``-inf``
    for a phase neither profiled size shows.

    ``sizes``: the two profiled micro-batch sizes; ``data`` and ``zero3``: the layer's transient (one kind: forward,
    first or later backward) measured alone at each in the data and ZeRO-3 scenarios; ``added``: what FSDP holds
    during the head's phase (forward: twice its gathered bytes; backward: once). At each size, ZeRO-3 above the
    data stage means the head set ZeRO-3's value (head = ZeRO-3's less ``added``), and ZeRO-3 less than ``added``
    above it means the loss set the data stage's (loss = the data stage's). A phase seen at both sizes is the
    straight line through them; seen at one, the loss is proportional to the rows (its bytes are the logits') and
    the head is kept at that value (it also holds parameter-sized gradients: a floor).

    >>> loss_phases([2, 4], [49, 98], [99, 132], 66, 8)  # head 33 and 66, loss 49 and 98: both lines
    (132.0, 196.0)
    >>> loss_phases([2, 4], [40, 65], [74, 82], 33, 8)  # head 41 and 49; the loss only at 4 (65): 65 x 8 / 4
    (65.0, 130.0)
    """
    (b1, d1, z1), (b2, d2, z2) = sorted(zip(sizes, data, zero3))
    heads = [(b, z - added) for b, d, z in ((b1, d1, z1), (b2, d2, z2)) if z > d]
    losses = [(b, d) for b, d, z in ((b1, d1, z1), (b2, d2, z2)) if z - d < added]

    def line(points: list[tuple[int, float]], single: Callable[[int, float], float]) -> float:
        if len(points) == 2:
            (x1, y1), (x2, y2) = points
            return float(y1 + (y2 - y1) * (size - x1) / (x2 - x1))
        return float(single(*points[0])) if points else -math.inf

    return (line(heads, lambda b, v: v), line(losses, lambda b, v: v * size / b))


@dataclass(frozen=True)
class RecomputedBackwards:
    """What a recomputed ZeRO-3 stage holds above its backward's level while each of its layers runs
    ([Note: a recomputed ZeRO-3 stage]): per layer of the span, ``-inf`` for one without parameters."""

    first: list[float]
    """The first backward: the layer's phase with its own whole gradients and the later layers' shards."""
    later: list[float]
    """A later backward (the shards are then in the level)."""
    prefetched: list[int]
    """The gathered bytes of the layer before it (FSDP2's backward prefetch), held where the backward follows a
    forward; not counted in ``first`` and ``later``."""


def recomputed_backwards(first_suffix: Sequence[float], later_suffix: Sequence[float], gathered: Sequence[int],
                         whole: Sequence[int], shards: Sequence[int]) -> RecomputedBackwards:
    """Each layer's backward moment in a recomputed ZeRO-3 stage, from the UNSHARDED recomputed stage's suffixes
    ([Note: a recomputed ZeRO-3 stage]).

    ``first_suffix[k]`` and ``later_suffix[k]``: the unsharded stage's first and later backward transients of the
    span's layers ``k..`` (the first holds the whole gradients of layers ``k..``: ``whole``); ``gathered``: each
    layer's gathered bytes; ``shards``: its reduce-scattered gradient on this rank. At layer ``k`` a rank holds
    the layer's phase (the first suffix less the later layers' whole gradients: recomputed, a layer's phase is
    its own, whatever runs after it; known where layer ``k`` sets that suffix, larger than the next one's, and
    ``-inf`` in ``first`` otherwise), its gathered bytes, the reduce-scatter input of the layer after it (FSDP2
    keeps it until the next layer's post-backward) and, in a first backward, the later layers' shards.
    A later backward is at least the unsharded stage's later suffix: every ZeRO-3 backward allocates its
    gradients afresh, as a first one does.

    >>> r = recomputed_backwards([100, 80], [70, 60], [40, 20], [40, 20], [20, 10])
    >>> r.first, r.later, r.prefetched  # first: 100 - 20 + 10 + 40 + 20, 80 + 20; later: 80 + 40 + 20, 80 + 20
    ([150, 100], [140, 100], [0, 40])
    >>> recomputed_backwards([100, 100], [70, 60], [40, 20], [40, 20], [20, 10]).first  # layer 1's phase sets both
    [-inf, 120]
    """
    first, later, prefetched = [], [], []
    last = len(gathered) - 1
    for k, size in enumerate(gathered):
        after = next((g for g in gathered[k + 1:] if g), 0)
        sets = k == last or first_suffix[k] > first_suffix[k + 1]
        own = first_suffix[k] - sum(whole[k + 1:]) if sets else -math.inf
        first.append(own + sum(shards[k + 1:]) + size + after if size else -math.inf)
        later.append(max(later_suffix[k], own) + size + after if size else -math.inf)
        prefetched.append(next((g for g in reversed(gathered[:k]) if g), 0))
    return RecomputedBackwards(first, later, prefetched)
