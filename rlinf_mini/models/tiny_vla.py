"""TinyVLA: a vision-language-action model small enough to train with PPO on a 2-core CPU in minutes.

    policy = TinyVLAPolicy.from_pretrained("results/tiny_vla")          # an HF folder: config.json, model.safetensors,
                                                                        # tokenizer.json (+ tokenizer_config.json)
    inputs = policy.prepare_inputs(obs)           # obs dict from the env -> tensors: images, input_ids, attention_mask
    out = policy.predict_action_batch(inputs, noise)   # rollout: actions [B, C, A], logprobs [B], values [B],
                                                       #          forward_inputs (inputs + action_tokens [B, C*A])
    out = policy.default_forward(out["forward_inputs"], out["actions"])   # actor: logprobs, entropy, values

The model, in the shape of OpenVLA-OFT (parallel decoding of all action tokens in one forward pass):

    image uint8 [B, 3, H, W] --conv patch embedding (kernel = stride = patch_size) + (row, col) features--> P tokens
    instruction --word-level tokenizer (saved with the model), padded to max_prompt_length--> L tokens
    states [B, state_dim] (the agent's position; optional) --linear--> 1 token
    C * A placeholder action tokens (learned embeddings, one per chunk step and action dim)
    [P image | L word | 1 state | C*A action tokens] -> BertModel (bidirectional, padding masked) -> hidden [B, S, D]
    action positions -> linear -> logits over n_action_bins [B, C*A, n_bins];  bin k -> linspace(-1, 1, n_bins)[k]
    mean of the action positions -> value head MLP -> value [B]

Sampling: tokens = argmax(logits / temperature + Gumbel(noise)), the noise being uniforms from the caller
(`counter_uniform`, as for the MLP), so a sample depends on (seed, env id, step) only. The log-probability of a chunk
is the sum over its C*A tokens of log_softmax(logits / temperature); the actor recomputes it from the stored tokens
with the same temperature. Eval mode takes the argmax. Dropout is 0, so train mode and eval mode compute the same.

RLinf counterpart: `rlinf/models/embodiment/openvla_oft/` (placeholder action tokens, logits restricted to the action
bins, `forward_inputs["action_tokens"]`, the value head on the action-token hidden states). A real VLA (OpenVLA, pi0)
would sit behind the same three calls (`prepare_inputs`, `predict_action_batch`, `default_forward`) and an HF folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from torch import Tensor, nn
from transformers import BertConfig, BertModel, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from rlinf_mini.models.hf_folder import write_folder_atomically

hf_logging.disable_progress_bar()  # a 0.1 M-parameter folder loads in a millisecond: no bar per worker in the log

MODEL_TYPE = "tiny_vla"
WORDS = ("move", "go", "to", "the", "a", "red", "blue", "green", "yellow", "block", "cube", "ball", "pick", "up",
         "place", "on", "left", "right", "of", "and")
"""The tokenizer's vocabulary besides [PAD] and [UNK]: the instructions' words and a few spare ones."""


def build_tokenizer(words: tuple[str, ...] = WORDS) -> PreTrainedTokenizerFast:
    """A word-level tokenizer built locally: lower-cased, split on whitespace and punctuation; id 0 = [PAD]."""
    vocab = {"[PAD]": 0, "[UNK]": 1} | {w: i + 2 for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


class TinyVLAConfig(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(self, image_size: int = 20, patch_size: int = 4, hidden_size: int = 64, num_hidden_layers: int = 2,
                 num_attention_heads: int = 4, vocab_size: int = len(WORDS) + 2, max_prompt_length: int = 8,
                 action_dim: int = 2, num_action_chunks: int = 1, n_action_bins: int = 3, state_dim: int = 0,
                 add_value_head: bool = True, **kwargs):
        self.image_size, self.patch_size = image_size, patch_size
        self.hidden_size, self.num_hidden_layers, self.num_attention_heads = hidden_size, num_hidden_layers, \
            num_attention_heads
        self.vocab_size, self.max_prompt_length = vocab_size, max_prompt_length
        self.action_dim, self.num_action_chunks, self.n_action_bins = action_dim, num_action_chunks, n_action_bins
        self.state_dim, self.add_value_head = state_dim, add_value_head
        super().__init__(**kwargs)

    def backbone_config(self) -> BertConfig:
        num_patches = (self.image_size // self.patch_size) ** 2
        seq_len = num_patches + self.max_prompt_length + (self.state_dim > 0) + self.action_dim * self.num_action_chunks
        return BertConfig(vocab_size=self.vocab_size, pad_token_id=0, hidden_size=self.hidden_size,
                          num_hidden_layers=self.num_hidden_layers,
                          num_attention_heads=self.num_attention_heads, intermediate_size=2 * self.hidden_size,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=seq_len,
                          type_vocab_size=1, attn_implementation="eager")


class TinyVLAForActionPrediction(PreTrainedModel):
    config_class = TinyVLAConfig
    base_model_prefix = "tiny_vla"

    def __init__(self, config: TinyVLAConfig):
        super().__init__(config)
        D, side = config.hidden_size, config.image_size // config.patch_size
        self.num_patches = side * side
        self.num_action_tokens = config.action_dim * config.num_action_chunks
        self.patch_embed = nn.Conv2d(3, D, kernel_size=config.patch_size, stride=config.patch_size)
        self.side = side
        self.coord_embed = nn.Linear(2, D)
        self.state_embed = nn.Linear(config.state_dim, D) if config.state_dim else None  # proprioception: one token
        self.action_queries = nn.Parameter(torch.randn(self.num_action_tokens, D))
        self.backbone = BertModel(config.backbone_config(), add_pooling_layer=False)
        self.action_head = nn.Linear(D, config.n_action_bins)
        self.value_head = (nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, 1))
                           if config.add_value_head else None)
        self.post_init()  # BERT's init (std 0.02) everywhere, then unit scale for the inputs:
        # with std 0.02 a colour, a word or a coordinate barely moves the first attention and the policy learns
        # much slower (docs/performance.md).
        with torch.no_grad():
            for layer in (self.patch_embed, self.coord_embed, self.state_embed):
                if layer is not None:
                    layer.reset_parameters()  # PyTorch's default (Kaiming-uniform) init
            nn.init.normal_(self.action_queries)
            words = self.backbone.get_input_embeddings().weight
            nn.init.normal_(words)
            words[0].zero_()  # [PAD]

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, images: Tensor, input_ids: Tensor, attention_mask: Tensor,
                states: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """images uint8 [B, 3, H, W], input_ids / attention_mask [B, L], states [B, state_dim] (if the config has a
        state_dim) -> (logits [B, C*A, n_bins], values [B])."""
        B = images.shape[0]
        patches = self.patch_embed(images.float() / 255.0).flatten(2).transpose(1, 2)  # [B, P, D]
        # (row, col) of each patch in [-1, 1]: makes "which direction is the block" a linear read-out
        line = torch.linspace(-1, 1, self.side, device=images.device)
        coords = torch.stack(torch.meshgrid(line, line, indexing="ij"), -1).reshape(-1, 2)  # [P, 2]
        patches = patches + self.coord_embed(coords)
        words = self.backbone.get_input_embeddings()(input_ids)  # [B, L, D]: BERT's own word embeddings
        actions = self.action_queries.expand(B, -1, -1)  # [B, C*A, D]
        state = [self.state_embed(states.float())[:, None]] if self.state_embed is not None else []  # [B, 1, D]
        parts = [patches, words, *state, actions]
        x = torch.cat(parts, dim=1)  # [B, S, D]: [image | words | state | action placeholders]
        tail = x.shape[1] - self.num_patches - attention_mask.shape[1]  # state + action tokens
        mask = torch.cat([attention_mask.new_ones(B, self.num_patches), attention_mask,
                          attention_mask.new_ones(B, tail)], dim=1)  # [B, S]: only word padding is masked
        hidden = self.backbone(inputs_embeds=x, attention_mask=mask).last_hidden_state[:, -self.num_action_tokens:]
        logits = self.action_head(hidden)  # [B, C*A, n_bins]
        values = (self.value_head(hidden.mean(1)).squeeze(-1) if self.value_head is not None
                  else hidden.new_zeros(B))
        return logits, values


class TinyVLAPolicy(nn.Module):
    """The tiny VLA and its tokenizer, behind the same calls as MLPPolicy (predict_action_batch, default_forward)."""

    def __init__(self, config: TinyVLAConfig, tokenizer: PreTrainedTokenizerFast | None = None,
                 temperature: float = 1.0):
        super().__init__()
        self.vla = TinyVLAForActionPrediction(config)
        self.tokenizer = tokenizer or build_tokenizer()
        self.temperature = temperature
        self.config = config
        self.num_action_chunks, self.action_dim = config.num_action_chunks, config.action_dim
        self.register_buffer("bin_centers", torch.linspace(-1.0, 1.0, config.n_action_bins), persistent=False)

    @property
    def noise_width(self) -> int:
        """Uniforms per sample for the Gumbel-max draw: one per (action token, bin)."""
        return self.vla.num_action_tokens * self.config.n_action_bins

    def prepare_inputs(self, obs: dict) -> dict[str, Tensor]:
        """Env obs dict -> model inputs: images uint8 [B, 3, H, W], input_ids and attention_mask int64 [B, L]."""
        enc = self.tokenizer(list(obs["task_descriptions"]), padding="max_length", truncation=True,
                             max_length=self.config.max_prompt_length, return_tensors="pt")
        device = self.bin_centers.device
        inputs = {"images": obs["images"].to(device), "input_ids": enc["input_ids"].to(device),
                  "attention_mask": enc["attention_mask"].to(device)}
        if self.config.state_dim:
            inputs["states"] = obs["states"].to(device)
        return inputs

    def _run(self, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        return self.vla(inputs["images"], inputs["input_ids"], inputs["attention_mask"], inputs.get("states"))

    def _logprob_entropy(self, logits: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Chunk log-prob and entropy [B] of tokens [B, C*A] under logits [B, C*A, n_bins] / temperature."""
        logp_all = (logits / self.temperature).log_softmax(-1)
        logprob = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, C*A]
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, C*A]
        return logprob.sum(-1), entropy.sum(-1)

    def predict_action_batch(self, inputs: dict[str, Tensor], noise: Tensor | None, mode: str = "train",
                             bootstrap_obs: dict[str, Tensor] | None = None) -> dict[str, Tensor | dict]:
        """Sample (train, with noise [B, C*A*n_bins] uniforms) or argmax (eval) the action tokens of a chunk.
        bootstrap_obs: inputs whose values alone are wanted too ("bootstrap_values", predict_values' own call)."""
        if mode not in ("train", "eval"):
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        logits, values = self._run(inputs)
        if mode == "eval":
            tokens = logits.argmax(-1)  # [B, C*A]
        else:
            expected = (logits.shape[0], self.noise_width)
            if noise is None or tuple(noise.shape) != expected:
                got = None if noise is None else tuple(noise.shape)
                raise ValueError(f"mode 'train' needs noise of shape {expected} (uniforms in (0, 1)), got {got}")
            gumbel = -torch.log(-torch.log(noise.reshape(logits.shape)))
            tokens = (logits / self.temperature + gumbel).argmax(-1)  # a sample of the tempered categorical
        logprobs, _ = self._logprob_entropy(logits, tokens)
        actions = self.bin_centers[tokens].reshape(-1, self.num_action_chunks, self.action_dim)  # [B, C, A]
        out = {"actions": actions, "logprobs": logprobs, "values": values,
               "forward_inputs": {**inputs, "action_tokens": tokens}}
        if bootstrap_obs is not None:
            out["bootstrap_values"] = self.predict_values(bootstrap_obs)
        return out

    def predict_values(self, inputs: dict[str, Tensor]) -> Tensor:
        """Values [B] (predict_action_batch's, without the sampling): a truncated episode's bootstrap value."""
        return self._run(inputs)[1]

    def default_forward(self, inputs: dict[str, Tensor], actions: Tensor | None = None,
                        compute_values: bool = True) -> dict[str, Tensor]:
        """Recompute logprobs, entropy and values [N] of the stored forward_inputs (their action_tokens), with
        gradients. `actions` is unused: the tokens, not their bin centres, are what was sampled."""
        logits, values = self._run(inputs)
        logprobs, entropy = self._logprob_entropy(logits, inputs["action_tokens"])
        return {"logprobs": logprobs, "entropy": entropy, "values": values if compute_values else values.detach() * 0}

    def forward(self, inputs: dict[str, Tensor], actions: Tensor | None = None,
                compute_values: bool = True) -> dict[str, Tensor]:
        return self.default_forward(inputs, actions, compute_values)

    def action_logits(self, inputs: dict[str, Tensor]) -> Tensor:
        """[B, C*A, n_bins], for tests and analysis."""
        return self._run(inputs)[0]

    def value_parameters(self) -> list[nn.Parameter]:
        return [] if self.vla.value_head is None else list(self.vla.value_head.parameters())

    # --- HF folders ------------------------------------------------------------------------------------------------

    def save_pretrained(self, path: str | Path) -> None:
        """config.json + model.safetensors + the tokenizer, written to a temporary folder that is renamed last."""

        def write(tmp: Path) -> None:
            self.vla.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)

        write_folder_atomically(path, write)

    @classmethod
    def from_pretrained(cls, path: str | Path, temperature: float = 1.0) -> TinyVLAPolicy:
        path = Path(path)
        try:
            model_type = json.loads((path / "config.json").read_text()).get("model_type")
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a model folder ({e})") from None
        if model_type != MODEL_TYPE:
            raise ValueError(f"{path}/config.json: model_type is {model_type!r}, expected {MODEL_TYPE!r}")
        with torch.random.fork_rng(devices=[]):  # loading must not shift anyone's random stream
            vla = TinyVLAForActionPrediction.from_pretrained(path)
        policy = cls(vla.config, PreTrainedTokenizerFast.from_pretrained(path), temperature)
        policy.vla = vla
        return policy


def tiny_vla_config(model_cfg, action_dim: int, image_shape: tuple[int, ...], state_dim: int = 0) -> TinyVLAConfig:
    """The TinyVLAConfig that the `actor.model` section (ModelConfig) and the env's spaces describe."""
    return TinyVLAConfig(image_size=image_shape[-1], patch_size=model_cfg.patch_size, hidden_size=model_cfg.hidden_dim,
                         num_hidden_layers=model_cfg.num_layers, num_attention_heads=max(1, model_cfg.hidden_dim // 16),
                         max_prompt_length=model_cfg.max_prompt_length, action_dim=action_dim,
                         num_action_chunks=model_cfg.num_action_chunks, n_action_bins=model_cfg.n_action_bins,
                         state_dim=state_dim, add_value_head=model_cfg.add_value_head)


def build_tiny_vla(model_cfg, obs_dim: int, action_dim: int, discrete: bool, image_shape: tuple[int, ...],
                   temperature: float = 1.0) -> TinyVLAPolicy:
    """Load actor.model.model_path, or build a fresh model (seeded by the caller) when it is ''."""
    if discrete or len(image_shape) != 3:
        raise ValueError("actor.model.model_type: 'tiny_vla' needs an env with images and a Box action space "
                         "(e.g. PixelReach-v0)")
    if model_cfg.model_path:
        policy = TinyVLAPolicy.from_pretrained(model_cfg.model_path, temperature)
        c = policy.config
        wanted = {"image_size": image_shape[-1], "action_dim": action_dim, "state_dim": obs_dim,
                  "num_action_chunks": model_cfg.num_action_chunks}
        for key, value in wanted.items():
            if getattr(c, key) != value:
                raise ValueError(f"actor.model.model_path: {model_cfg.model_path!r} has {key}={getattr(c, key)}, "
                                 f"but the config / env has {value}")
        if model_cfg.add_value_head and not c.add_value_head:
            raise ValueError(f"actor.model.model_path: {model_cfg.model_path!r} has no value head, "
                             "but actor.model.add_value_head is true")
        return policy
    return TinyVLAPolicy(tiny_vla_config(model_cfg, action_dim, image_shape, obs_dim), temperature=temperature)
