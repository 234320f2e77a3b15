"""REINFORCE on an environment of the script's own (`reset`/`step`, gymnasium's return values): the data are
episodes, not a DataLoader; each episode ends on its own `terminated`, and training stops when the running reward
passes a threshold (a per-process value on several processes). The shape of pytorch/examples'
reinforcement_learning (reinforce.py, actor_critic.py), without gymnasium."""
import argparse
from itertools import count

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical

parser = argparse.ArgumentParser()
parser.add_argument("--gamma", type=float, default=0.9)
parser.add_argument("--seed", type=int, default=7)
parser.add_argument("--threshold", type=float, default=9.0)
parser.add_argument("--max-episodes", type=int, default=60)
args = parser.parse_args()


class Walk:
    """Keep a walker on a plank of 7 cells: the push is noisy, reward 1 per step, off the plank ends it."""

    def __init__(self, length=7, limit=16):
        self.length, self.limit = length, limit
        self.rng = np.random.default_rng()

    def reset(self, seed=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.position, self.steps = self.length // 2, 0
        return self._observe(), {}

    def step(self, action):
        push = 1 if action == 1 else -1
        self.position += push if self.rng.random() < 0.7 else -push
        self.steps += 1
        terminated = not 0 <= self.position < self.length
        return self._observe(), 1.0, terminated, self.steps >= self.limit, {}

    def _observe(self):
        return np.array([self.position / self.length, self.steps / self.limit], dtype=np.float32)


env = Walk()
env.reset(seed=args.seed)
torch.manual_seed(args.seed)


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(2, 16)
        self.out = nn.Linear(16, 2)
        self.saved_log_probs = []
        self.rewards = []

    def forward(self, x):
        return F.softmax(self.out(F.relu(self.hidden(x))), dim=1)


policy = Policy()
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)


def select_action(state):
    probs = policy(torch.from_numpy(state).float().unsqueeze(0))
    m = Categorical(probs)
    action = m.sample()
    policy.saved_log_probs.append(m.log_prob(action))
    return action.item()


def finish_episode():
    R = 0
    returns = []
    for r in policy.rewards[::-1]:
        R = r + args.gamma * R
        returns.insert(0, R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + 1e-6)
    loss = torch.cat([-log_prob * R for log_prob, R in zip(policy.saved_log_probs, returns)]).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    del policy.rewards[:]
    del policy.saved_log_probs[:]


def main():
    running_reward = 5.0
    for i_episode in count(1):
        state, _ = env.reset()
        ep_reward = 0
        for t in range(1, 100):
            action = select_action(state)
            state, reward, terminated, truncated, _ = env.step(action)
            policy.rewards.append(reward)
            ep_reward += reward
            if terminated or truncated:
                break
        running_reward = 0.3 * ep_reward + 0.7 * running_reward
        finish_episode()
        print(f"Episode {i_episode}\tLast reward: {ep_reward:.2f}\tAverage reward: {running_reward:.2f}")
        if running_reward > args.threshold or i_episode >= args.max_episodes:
            print(f"Stopped: running reward {running_reward:.2f} after {i_episode} episodes")
            break


if __name__ == "__main__":
    main()
